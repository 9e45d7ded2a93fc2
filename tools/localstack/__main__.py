"""``python -m tools.localstack``: the stack without a job, until Ctrl-C (to look around)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from tools.localstack.base import StackConfig
from tools.localstack.common import REPO
from tools.localstack.stack import LocalStack


def _interrupt(_signum: int, _frame: object) -> None:
    """SIGTERM stops the stack the way Ctrl-C does."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.localstack``: the stack without a job, until Ctrl-C (to look around)."""
    import argparse  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    ap = argparse.ArgumentParser(prog="python -m tools.localstack", description=main.__doc__)
    ap.add_argument("--cluster-name", default="rtj-stack")
    ap.add_argument("--namespace", default="rtj-demo")
    ap.add_argument("--nodes", type=int, default=3)
    args = ap.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="rtj-stack-"))
    cfg = StackConfig(
        workdir=workdir,
        cluster_name=args.cluster_name,
        namespace=args.namespace,
        nodes=args.nodes,
        say=lambda line: print(line, flush=True),
    )
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with LocalStack(cfg) as stack:
            manifest = REPO / "tests" / "e2e" / "manifests" / "spot-job.yaml"
            print(
                f"\nexport KUBECONFIG={stack.kubeconfig}\n"
                f"export PATH={stack.bindir}:$PATH\n"
                f"kubectl apply -n {args.namespace} -f {manifest}\n"
                f"kubectl get rtj -n {args.namespace} -w\n"
                f"kubectl get pods -n {args.namespace} -o wide  # NODE: where the ranks run\n"
                f"{sys.executable} -m tools.podrunner kill-node <a rank's node> --delete-node "
                f"--state-dir {stack.state_dir}\n"
                f"logs: {workdir}\nCtrl-C stops everything.",
                flush=True,
            )
            signal.pause()
    except KeyboardInterrupt:
        print("stopping", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
