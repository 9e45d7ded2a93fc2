"""The README's main command: a training job on spot nodes loses a node and finishes by itself.

    python examples/demo_cluster.py                 # make demo
    python examples/demo_cluster.py --scenario notice
    python examples/demo_cluster.py --scenario elastic
    python examples/demo_cluster.py --scenario kueue

On this machine, with nothing but Go and this repository: builds (once) or reuses the local
Kubernetes control plane and MinIO, starts the cluster, installs the operator's Helm chart, runs
the operator, an S3 server and three "spot" nodes whose pods run as local processes (the pod
runner), applies a 2-rank ResumableTrainingJob, takes the node of rank 1 away midway, and narrates
what the operator and the runtime do about it. It ends with a summary and exit code 0 when the job
Succeeded with the same final weights, bit for bit, as an uninterrupted run of the same script.
Everything it started is stopped again, also on Ctrl-C or a failure. What each line means:
docs/demo.md.

``--nodes real`` (``make demo NODES=real``, as root) runs the job on real nodes instead: three
kubelets, each with its own containerd and network namespace, CNI networking, kube-proxy and
CoreDNS; the operator as the chart's Deployment pod from the operator image, the rank from the
runtime image, both built by buildah without a registry (tools/realnodes.py). ``reclaim`` loses
the rank's node (kubelet and containerd SIGKILLed, Node deleted); ``notice`` taints it first,
then shuts the pod down gracefully: the same story (tools/stories/spot.py) over another cluster
(tools/spotcluster.py), set up by tools/stories/realnodes.py. Cold, the images take about 15
minutes more to build than the control plane alone.

``--scenario elastic`` runs a 4-rank elastic job (minReplicas 2) on exactly four nodes instead:
two nodes are lost with no spare, the job shrinks to 2 ranks, two nodes return and it grows back
to 4 after a checkpoint; it exits 0 when every sample was consumed exactly once and each new gang
loaded, bit for bit, the state the old one saved (tools/stories/elastic.py).

``--scenario kueue`` runs the job in a Kueue queue instead (``make demo SCENARIO=kueue``): a
control plane with Kueue v0.17.0 started as a local process, the operator and two pod-runner nodes
(tools/kueuebed.py; no chart, no S3: checkpoints go to a local folder every node shares). The
2-rank job runs in a LocalQueue whose ClusterQueue holds exactly its 2 CPUs; a pod of a
higher WorkloadPriorityClass then takes the quota. Kueue evicts the job, the ranks save on
SIGTERM, the operator records a preemption with cause ``KueueEviction``, the next attempt waits in
the queue and resumes from that save once the high-priority pod is done (tools/stories/kueue.py).
It exits 0 when every check held, the final weights included.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools import kueue as kq  # noqa: E402
from tools import localstack  # noqa: E402
from tools.kueuebed import KueueBed  # noqa: E402
from tools.localstack import (  # noqa: E402
    LocalStack,
    ReferenceRun,
    StackConfig,
    StackError,
    fetched_from,
    resumed_step,
    start_reference_run,
    weights_equal,
)
from tools.realnodes import (  # noqa: E402
    RealNodes,
    RealNodesError,
    build_all,
    install_tools,
    missing_prerequisites,
)
from tools.spotcluster import LOST, NOTICE, PodRunnerCluster  # noqa: E402
from tools.stories import elastic, print_checks  # noqa: E402
from tools.stories import kueue as kueue_story  # noqa: E402
from tools.stories import realnodes as real_story  # noqa: E402
from tools.stories.spot import SpotStory, StoryResult  # noqa: E402
from tools.waiting import WaitTimeoutError  # noqa: E402

MANIFEST = REPO / "tests" / "e2e" / "manifests" / "spot-job.yaml"
JOB = "spot-demo"
ELASTIC_JOB = "elastic-demo"
KUEUE_JOB = "queued-demo"
INTERRUPTIONS = {"reclaim": [LOST], "notice": [NOTICE]}
"""--scenario -> the spot story's interruptions (tools/stories/spot.py), on either kind of node."""


def say(line: str) -> None:
    """One line of narration, at once (the demo is watched live)."""
    print(line, flush=True)


def section(title: str) -> None:
    """A heading between the demo's phases."""
    say(f"\n== {title}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--scenario",
        choices=("reclaim", "notice", "elastic", "kueue"),
        default="reclaim",
        help="reclaim: the node goes without notice (default); notice: a "
        "termination taint first, then a graceful shutdown; elastic: a 4-rank elastic job "
        "shrinks to 2 when 2 of its 4 nodes go and grows back when they return; kueue: a job "
        "in a Kueue queue is preempted by a higher-priority workload and resumes after it",
    )
    ap.add_argument(
        "--nodes",
        choices=("simulated", "real"),
        default="simulated",
        help="simulated: pods run as local processes (the pod runner; default); real: real "
        "kubelets and containerd run the project's images (root; reclaim and notice only)",
    )
    ap.add_argument(
        "--s3",
        choices=("auto", "minio", "moto"),
        default="auto",
        help="S3 server: auto builds MinIO when Go is there, else uses moto",
    )
    ap.add_argument(
        "--cluster-name",
        default="rtj-demo",
        help="local cluster name (default %(default)s; deleted at the end)",
    )
    ap.add_argument(
        "--lose-after-step",
        type=int,
        default=12,
        help="take the node(s) away (kueue: submit the high-priority workload) once a "
        "checkpoint at this step is committed",
    )
    ap.add_argument(
        "--keep-logs",
        action="store_true",
        help="keep the work folder (logs of every component) after a success too",
    )
    return ap.parse_args(argv)


def on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    """SIGTERM cleans up like Ctrl-C."""
    raise KeyboardInterrupt


def summary(result: StoryResult, equal: bool, why: str, total_s: float, stack_s: float) -> None:
    """The end of the demo: what happened, from the job's status and the runtime's events."""
    status = result.status
    interruption = (status.get("interruptions") or [{}])[-1]
    resumed = resumed_step(result.logs.get(1, ""))
    source = fetched_from(result.logs.get(1, "")) or "?"
    last = status.get("lastCommittedCheckpoint") or {}
    rows = [
        (
            "job",
            f"{result.job}: {status.get('phase')} after {status.get('attempt', 0) + 1} "
            f"attempts, {result.seconds:.0f} s from submission",
        ),
        (
            "preemptions",
            f"{status.get('preemptions', 0)} ({interruption.get('cause')} of rank "
            f"{interruption.get('rank')} on {interruption.get('node')}); "
            f"failures {status.get('failures', 0)}",
        ),
        (
            "before the loss",
            f"last committed step {interruption.get('lastCommittedStep')}; "
            f"steps lost (operator's count) {interruption.get('stepsLost')}",
        ),
        ("resumed at step", f"{resumed} (fetched {source})"),
        ("final checkpoint", f"{last.get('name')} at step {last.get('step')}"),
        (
            "final weights",
            (
                "bitwise equal to an uninterrupted run"
                if equal
                else "DIFFERENT from an uninterrupted run"
            )
            + f" ({why})",
        ),
        ("time", f"{total_s:.0f} s in all, {stack_s:.0f} s of it starting the stack"),
    ]
    notice = result.interruptions[0].notice if result.interruptions else None
    if notice:
        rows.insert(
            3,
            (
                "notice save",
                f"checkpoint {notice[0]} at step {notice[1]}, as soon as the taint appeared",
            ),
        )
    section("summary")
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        say(f"  {key:<{width}}  {value}")


def elastic_demo(args: argparse.Namespace, workdir: Path, s3_kind: str | None) -> bool:
    """The elastic scenario on a stack of exactly 4 nodes; whether every check held."""
    section("2. the local cluster: control plane, chart, S3, operator, 4 spot nodes")
    cfg = StackConfig(
        workdir=workdir / "stack",
        cluster_name=args.cluster_name,
        namespace="rtj-demo",
        s3_kind=s3_kind,
        nodes=4,
        say=say,
    )
    with LocalStack(cfg) as stack:
        section(
            f"3. the job ({elastic.MANIFEST.relative_to(REPO)}): 4 ranks, minReplicas 2, "
            "8 samples per step at any size, a checkpoint every 4 steps to S3"
        )
        result = elastic.ElasticStory(
            stack, ELASTIC_JOB, say=say, lose_after_step=args.lose_after_step
        ).run()
        checks = elastic.verdicts(result, stack.results_dir)
        section("summary (from the ranks' own traces and state digests)")
        print_checks(checks, say)
        say(f"  job {result.job}: {result.status.get('phase')} in {result.seconds:.0f} s")
        section("cleaning up (operator, nodes, S3 server, cluster)")
    return all(c.ok for c in checks) and result.status.get("phase") == "Succeeded"


def kueue_demo(args: argparse.Namespace, workdir: Path) -> bool:
    """The kueue scenario on the Kueue bed; whether every check of the story held."""
    if not kq.built():
        say(f"building Kueue {kq.version()} from the Go module proxy (minutes, once)")
        kq.build()
    section("2. the local cluster: control plane, Kueue, operator, 2 pod-runner nodes")
    reference: ReferenceRun = start_reference_run(MANIFEST, workdir / "reference")
    say(
        "meanwhile: the same script runs uninterrupted as two plain processes, for the "
        "final comparison"
    )
    namespace = "rtj-demo"
    try:
        with KueueBed(
            f"{args.cluster_name}-kueue",
            workdir / "bed",
            namespaces=namespace,
            pool_label="rtj-demo/pool",
            say=say,
        ) as bed:
            bed.up(nodes=2, cpu="4")
            bed.create_namespace(namespace)
            section(
                f"3. the job ({MANIFEST.relative_to(REPO)}'s training): 2 ranks, 48 steps, a "
                "checkpoint every 4 steps, in a Kueue queue"
            )
            story = kueue_story.KueueStory(
                bed, namespace, KUEUE_JOB, say=say, preempt_after_step=args.lose_after_step
            )
            result = story.run()
            section("4. comparing the final weights with the uninterrupted run")
            weights = result.weights
            if weights is not None and weights.exists():
                equal, why = weights_equal(reference.wait(), weights)
            else:
                equal, why = False, "the job wrote no final weights"
            say(f"{'equal' if equal else 'DIFFERENT'}: {why}")
            checks = kueue_story.verdicts(result, equal, why)
            section("summary (from the job's status and the ranks' own events)")
            ok = print_checks(checks, say)
            say(f"  job {result.job}: {result.status.get('phase')} in {result.seconds:.0f} s")
            section("cleaning up (operator, nodes, Kueue, cluster)")
    finally:
        reference.kill()
    return ok and result.status.get("phase") == "Succeeded"


def spot_demo(args: argparse.Namespace, workdir: Path, s3_kind: str | None, started: float) -> bool:
    """The reclaim and notice scenarios; whether the job ended with the reference's weights."""
    section("2. the local cluster: control plane, chart, S3, operator, 3 spot nodes")
    reference: ReferenceRun = start_reference_run(MANIFEST, workdir / "reference")
    say(
        "meanwhile: the same script runs uninterrupted as two plain processes, for the "
        "final comparison"
    )
    cfg = StackConfig(
        workdir=workdir / "stack",
        cluster_name=args.cluster_name,
        namespace="rtj-demo",
        s3_kind=s3_kind,
        say=say,
    )
    try:
        stack_start = time.monotonic()
        with LocalStack(cfg) as stack:
            stack_s = time.monotonic() - stack_start
            section(
                f"3. the job ({MANIFEST.relative_to(REPO)}): 2 ranks, 48 steps, a "
                "checkpoint every 4 steps to S3"
            )
            story = SpotStory(
                PodRunnerCluster(stack),
                MANIFEST,
                JOB,
                say=say,
                lose_after_step=args.lose_after_step,
            )
            result = story.run(INTERRUPTIONS[args.scenario])
            section("4. comparing the final weights with the uninterrupted run")
            if result.weights.exists():
                equal, why = weights_equal(reference.wait(), result.weights)
            else:
                equal, why = False, f"the job wrote no final weights\n{result.diagnostics}"
            say(f"{'equal' if equal else 'DIFFERENT'}: {why}")
            summary(result, equal, why, time.monotonic() - started, stack_s)
            section("cleaning up (operator, nodes, S3 server, cluster)")
    finally:
        reference.kill()
    return equal and result.status.get("phase") == "Succeeded"


def real_demo(args: argparse.Namespace, workdir: Path) -> bool:
    """The reclaim or notice scenario on real nodes; whether every check of the story held."""
    missing = missing_prerequisites()
    if missing and os.geteuid() == 0:
        say(
            "installing Debian packages: mmdebstrap, buildah, containerd, ... (hack/images/deps.sh)"
        )
        install_tools()
        missing = missing_prerequisites()
    if missing:
        raise RealNodesError(f"real nodes need {', '.join(missing)}")
    archives = build_all(say=say)
    section("2. the local cluster: control plane, 3 real nodes, CoreDNS, the images imported")
    with RealNodes(args.cluster_name, say=say).up(archives) as cluster:
        ns = "rtj-demo"
        cluster.create_namespace(ns)
        section(
            f"3. the job: 1 rank of examples/train_deterministic.py, {real_story.TOTAL_STEPS} "
            "steps, a checkpoint every 4 steps to a folder every node mounts"
        )
        with real_story.shared_folder(ns) as shared:
            result = real_story.run(
                cluster, ns, shared, workdir / "story", INTERRUPTIONS[args.scenario], say=say
            )
            checks = real_story.verdicts(result)
        section("summary (from the job's status and the runtime's events in kubectl logs)")
        ok = print_checks(checks, say)
        say(f"  time: {result.seconds:.0f} s for the story")
        section("cleaning up (nodes, cluster)")
    return ok


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 when the job Succeeded with the uninterrupted run's weights (elastic:
    when every check of the story held)."""
    args = parse_args(argv)
    if args.nodes == "real" and args.scenario not in INTERRUPTIONS:
        say(
            f"--scenario {args.scenario} runs on --nodes simulated only: expected one of "
            f"{', '.join(INTERRUPTIONS)} with --nodes real"
        )
        return 2
    signal.signal(signal.SIGTERM, on_sigterm)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="rtj-demo-"))
    if args.scenario == "elastic":
        say(
            "resumable-training demo: a 4-rank elastic PyTorch job on spot nodes shrinks to 2 "
            f"ranks when 2 nodes go and grows back when they return (work folder {workdir})"
        )
    elif args.scenario == "kueue":
        say(
            "resumable-training demo: a 2-rank PyTorch job in a Kueue queue is preempted by a "
            f"higher-priority workload and resumes from its save (work folder {workdir})"
        )
    elif args.nodes == "real":
        say(
            "resumable-training demo on real nodes: a PyTorch job's node "
            f"{'announces its end' if args.scenario == 'notice' else 'is lost'} midway and the "
            f"job finishes by itself (work folder {workdir})"
        )
    else:
        say(
            "resumable-training demo: a 2-rank PyTorch job on spot nodes loses a node midway and "
            f"finishes by itself (work folder {workdir})"
        )
    try:
        if args.nodes == "real":
            section("1. binaries and images (built once into ~/.cache/rtj, then reused)")
            ok = real_demo(args, workdir)
            return finish(args, workdir, ok)
        section("1. binaries (built once into ~/.cache/rtj, then reused)")
        localstack.build_cluster_binaries(say)
        if args.scenario == "kueue":
            return finish(args, workdir, kueue_demo(args, workdir))
        s3_kind = None if args.s3 == "auto" else args.s3
        if args.s3 in ("auto", "minio") and not localstack.build_minio(say):
            if args.s3 == "minio":
                raise StackError("MinIO could not be built (see above); try --s3 moto")
            s3_kind = "moto"
        if args.scenario == "elastic":
            ok = elastic_demo(args, workdir, s3_kind)
        else:
            ok = spot_demo(args, workdir, s3_kind, started)
    except KeyboardInterrupt:
        say("\ninterrupted: everything it started has been stopped")
        shutil.rmtree(workdir, ignore_errors=True)
        return 130
    except (StackError, WaitTimeoutError, RealNodesError, kq.KueueError) as err:
        say(f"\nFAILED: {err}")
        say(f"logs of every component are kept in {workdir} (docs/demo.md, Troubleshooting)")
        return 1
    return finish(args, workdir, ok)


def finish(args: argparse.Namespace, workdir: Path, ok: bool) -> int:
    """The last lines and the exit code: 0 when every check held."""
    if ok and not args.keep_logs:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        say(f"logs kept in {workdir}")
    done = {
        "elastic": "the job shrank and grew back",
        "kueue": "the job survived a Kueue preemption",
    }.get(args.scenario, "the job survived losing a node")
    say(f"done: {done}" if ok else "the demo did not end as expected")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
