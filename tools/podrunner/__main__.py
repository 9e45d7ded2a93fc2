"""Command line: ``python -m tools.podrunner`` (serve nodes) and ``... kill-node`` (lose one).

    python -m tools.podrunner --kubeconfig K --node N [--node N2 ...] --workdir DIR
    python -m tools.podrunner kill-node --kubeconfig K [--state-dir S] NAME [--delete-node]

Run one agent process per node when you want to lose nodes one at a time: ``kill-node``
SIGKILLs the agent serving NAME (its pods' processes die with it) and optionally deletes the
Node object, which are the two ways a spot node disappears.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from tools.kubeapi import ApiError, Kube

from .agent import Agent, agent_file
from .nodes import NodeConfig, parse_taint
from .ports import PortRegistry
from .preparation import Context
from .processes import Watchdog
from .resolver import make_resolver
from .serviceaccount import check_server_certificate
from .translate import Interpreter, PodAddresses

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The folder holding ``tools/`` (the repository root): on every pod's PYTHONPATH."""
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "TZ")


def default_state_dir() -> Path:
    """Shared by all agents of this user unless told otherwise (ports, PVC folders, pid files)."""
    return Path(tempfile.gettempdir()) / f"podrunner-{os.getuid()}"


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _image_path(text: str) -> tuple[str, str]:
    image, sep, local = text.partition("=")
    if not sep or not image.startswith("/") or not local:
        raise argparse.ArgumentTypeError(f"expected /IMAGE/PATH=LOCAL_PATH, got {text!r}")
    return image, str(Path(local).resolve())


def _taint(text: str) -> dict[str, str]:
    try:
        return parse_taint(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def run_parser() -> argparse.ArgumentParser:
    """Arguments of the agent."""
    p = argparse.ArgumentParser(
        prog="python -m tools.podrunner",
        description="Development stand-in for a kubelet: runs the pods bound to the given "
        "Nodes as local processes. Not for production. "
        "Subcommand: kill-node (see 'python -m tools.podrunner kill-node -h').",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig of the cluster (default: $KUBECONFIG)",
    )
    p.add_argument(
        "--node",
        action="append",
        required=True,
        dest="nodes",
        help="a Node name to register and serve (repeatable)",
    )
    p.add_argument(
        "--workdir",
        required=True,
        type=Path,
        help="pod folders (volumes, termination files) and container logs",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=default_state_dir(),
        help="folder shared by all agents: port registry, PVC folders, pid files "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter that replaces python/python3 in container commands (default: this one)",
    )
    p.add_argument(
        "--cwd",
        default=str(PACKAGE_ROOT),
        help="working folder when the container's workingDir does not exist here "
        "(default: the repository root)",
    )
    p.add_argument(
        "--image-path",
        action="append",
        type=_image_path,
        default=[],
        metavar="IMAGE_PATH=LOCAL",
        help="a path of the (ignored) image and the local folder that stands in for it, "
        "rewritten like a mount path (repeatable); e.g. /app=. for the rtj-train image, "
        "whose WORKDIR /app holds examples/",
    )
    p.add_argument(
        "--label",
        action="append",
        type=_label,
        default=[],
        help="extra Node label KEY=VALUE (repeatable)",
    )
    p.add_argument(
        "--taint",
        action="append",
        type=_taint,
        default=[],
        help="Node taint KEY[=VALUE]:EFFECT (repeatable)",
    )
    p.add_argument("--cpu", default="32", help="Node capacity: cpu (default: %(default)s)")
    p.add_argument("--memory", default="256Gi", help="Node capacity: memory")
    p.add_argument("--max-pods", default="110", help="Node capacity: pods")
    p.add_argument(
        "--pass-env",
        action="append",
        default=[],
        help="pass this variable of the agent's environment to every container "
        f"(repeatable; always passed: {', '.join(PASSED_ENV)})",
    )
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        help="longest grace given to pods when the agent is stopped (seconds)",
    )
    p.add_argument(
        "--heartbeat",
        type=float,
        default=5.0,
        help="Lease renewal interval in seconds (default: %(default)s)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return p


def kill_parser() -> argparse.ArgumentParser:
    """Arguments of kill-node."""
    p = argparse.ArgumentParser(
        prog="python -m tools.podrunner kill-node",
        description="Simulate losing a node: SIGKILL the agent serving it (its pods' "
        "processes die with it); the Node stops heartbeating and goes NotReady.",
    )
    p.add_argument("name", help="the Node name")
    p.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    p.add_argument("--state-dir", type=Path, default=default_state_dir())
    p.add_argument(
        "--delete-node",
        action="store_true",
        help="also delete the Node object (a reclaimed spot VM)",
    )
    p.add_argument(
        "--graceful",
        action="store_true",
        help="SIGTERM instead: a graceful node shutdown (DisruptionTarget, grace)",
    )
    return p


def kill_node(args: argparse.Namespace) -> int:
    """Signal the agent that serves ``args.name``; optionally delete its Node."""
    pid_file = agent_file(args.state_dir, args.name, "pid")
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        print(f"no running agent recorded for node {args.name} ({pid_file})", file=sys.stderr)
        pid = 0
    if pid:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            cmdline = b""
        if b"tools.podrunner" not in cmdline:
            print(f"pid {pid} is not a podrunner agent any more", file=sys.stderr)
        else:
            os.kill(pid, signal.SIGTERM if args.graceful else signal.SIGKILL)
            print(
                f"{'SIGTERM' if args.graceful else 'SIGKILL'} sent to agent {pid}", file=sys.stderr
            )
            if not args.graceful:
                pid_file.unlink(missing_ok=True)
    if args.delete_node:
        try:
            Kube(args.kubeconfig).request("DELETE", f"/api/v1/nodes/{args.name}")
            print(f"node {args.name} deleted", file=sys.stderr)
        except ApiError as err:
            if not err.not_found:
                raise
    return 0


def serve(args: argparse.Namespace) -> int:
    """Run the agent until SIGTERM/SIGINT."""
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s podrunner[{','.join(args.nodes)}] %(levelname)s %(message)s",
    )
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    kube = Kube(args.kubeconfig)
    workdir = args.workdir.resolve()
    state_dir = args.state_dir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    base_env = {k: os.environ[k] for k in (*PASSED_ENV, *args.pass_env) if k in os.environ}
    host, port = kube.server_address
    problem = check_server_certificate(host, port, kube.ca_pem)
    if problem:
        logging.getLogger("podrunner").warning(
            "pods cannot verify the API server with their ca.crt: %s", problem
        )
    base_env.update(
        {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": str(port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        }
    )
    python_path = [str(PACKAGE_ROOT)]
    if Path(args.cwd).resolve() != PACKAGE_ROOT:
        python_path.append(str(Path(args.cwd).resolve()))
    ctx = Context(
        kube=kube,
        workdir=workdir,
        state_dir=state_dir,
        interpreter=Interpreter(args.python),
        cwd=args.cwd,
        python_path=python_path,
        watchdog=Watchdog(PACKAGE_ROOT),
        ports=PortRegistry(state_dir),
        base_env=base_env,
        addrs=PodAddresses(),
        shutdown_grace_s=args.shutdown_grace,
        resolves=make_resolver(),
        image_paths=list(args.image_path),
    )
    configs = [
        NodeConfig(
            name,
            cpu=args.cpu,
            memory=args.memory,
            pods=args.max_pods,
            labels=dict(args.label),
            taints=args.taint,
        )
        for name in args.nodes
    ]
    agent = Agent(ctx, configs, heartbeat_s=args.heartbeat)

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("podrunner").info("signal %d received", signum)
        agent.stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        agent.run()
    finally:
        ctx.watchdog.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "kill-node":
        return kill_node(kill_parser().parse_args(argv[1:]))
    if argv and argv[0] == "run":
        argv = argv[1:]
    return serve(run_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
