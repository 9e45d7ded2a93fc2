"""The goodput benchmark of record: a window of a real spot trace replayed on the local cluster,
with a fixed and an elastic job side by side, each on its own pool of nodes following the trace.

    python benchmarks/goodput.py [--trace NAME --window-start S --window SECONDS --compress F]
        [--replicas 4 --min-replicas 2 --step-sleep 0.5 --notice-share 0.5 --repeat N]
        [--survivors Replace|Stay]
        [--json out.json]

``--window-start`` and ``--window`` are in the trace's own seconds; the replay lasts
``window / compress`` seconds. docs/goodput.md defines the figure ("What goodput is") and has
the figures of record ("Replayed on the local cluster").

Why on the cluster and not only in ``goodput_sim.py``: the simulator's costs are assumptions,
and what the product really does after a loss (detection, teardown, gang scheduling, the elastic
policy's waits and grows, the runtime's start, fetch and load, the steps rolled back) is only
known by running it. This replays minutes of a trace at 4 nodes with steps emulated by a sleep
(``--step-sleep``: CPU contention on a 2-core machine must not decide the result) and measures:

* **goodput** per job: global samples in the newest checkpoint committed to the bucket at the
  window's end, less those reached when it opened, over the ideal (the nodes available, capped
  at ``replicas``, integrated over the window, times the full gang's per-node rate measured from
  the job's own commits before the window opened). The elastic job keeps its per-rank batch
  (the global batch follows the gang's size), so its throughput is linear in its size as the
  ideal assumes: with ``--global-batch-size`` and a sleep per optimizer step a half gang would
  train as fast as the whole one;
* the **ceiling** (capacity below what the job can train with is unusable) and the time lost
  per cause (below the minimum, under a notice, waiting for the full gang, restarting, training
  below the capacity, slower steps, rolled back), beside the operator's own account of the same
  window (``status.goodput``, read when it opens and closes);
* each interruption's **recovery phases** from the product's own timestamps (status, pod
  conditions, runtime events), their medians as ``goodput_sim.py --costs`` reads them (the JSON
  written by ``--json`` is such a file), and the operator's ``stepsLost`` against the ranks' own
  ``--trace`` records.

Both pools lose the same slots at the same moments (seeded) with the same notices (spread
evenly over the losses, as in the simulator): a notice taints the node
``--notice-s / compress`` before it shuts down; the others are reclaimed without notice. Rejected:
one pool shared by both jobs (one job's pods would decide which node the other loses).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # first: Ctrl-C during the imports below ends quietly
    import interrupt

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: tools/ and trainer_runtime/ from this checkout
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from benchmarks import goodput_phases as gp  # noqa: E402
from benchmarks import spot_traces  # noqa: E402
from rtj_operator.api.names import (  # noqa: E402
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_RANK,
    LABEL_ROLE,
)
from tools.kubeapi import ApiError  # noqa: E402
from tools.localstack import S3_SECRET, LocalStack, StackConfig  # noqa: E402
from tools.waiting import wait_for  # noqa: E402
from trainer_runtime import events  # noqa: E402

Obj = dict[str, Any]
Say = Callable[[str], None]

TRACE = "bamboo/g4dn-us-east-1c-2020-11-20"
WINDOW_START = 24000.0
"""At full capacity (4 of the trace's 12 nodes or more since 22015 s), 475 s before the first
of the 8 changes the trace makes to a 4-node gang after its start (the 9th, 0 -> 4, is its
start)."""
WINDOW = 6400.0
COMPRESS = 16.0
TAINT = "aws-node-termination-handler/spot-itn"
"""The spot interruption notice's taint (the traces are AWS's), one the operator watches."""
POOL_LABEL = "pool"
DATASET = 4096
TRAINER = "/app/examples/train_deterministic.py"


@dataclass(frozen=True)
class Config:
    """One replay's settings (the command line)."""

    trace: str = TRACE
    window_start: float = WINDOW_START
    window: float = WINDOW
    compress: float = COMPRESS
    replicas: int = 4
    min_replicas: int = 2
    step_sleep: float = 0.5
    batch_size: int = 2
    interval_steps: int = 10
    notice_share: float = 0.5
    notice_s: float = 120.0
    """How long before its loss a noticed node is tainted, in trace seconds (AWS: 2 minutes)."""
    seed: int = 1
    shrink_after_s: int = 10
    grow_interval_s: int = 20
    grow_settle_s: int = 10
    warmup_commits: int = 4
    poll_s: float = 0.5
    repeat: int = 1
    survivors: str = "Replace"
    """Both jobs' ``spec.recovery.survivors`` (``Stay``: docs/survivors.md)."""
    in_process_switch: bool = False
    """The elastic job's ``spec.recovery.inProcessSwitch`` (with ``Stay``), its trainer built
    for it (``--in-process-switch``)."""

    def capacity(self) -> spot_traces.Trace:
        """The window, capped at the job's size, compressed: what each pool follows."""
        trace = spot_traces.load(self.trace)
        window = trace.window(self.window_start, self.window).capped(self.replicas)
        return window.compressed(self.compress)


# -- the plan: which slot of each pool goes or comes, and when ---------------------------------


@dataclass(frozen=True)
class Action:
    """One thing done to both pools at replay time ``t``: ``taint`` (a notice), ``shutdown``
    (a noticed node goes), ``reclaim`` (a node goes without notice) or ``add``."""

    t: float
    kind: str
    slot: int


ORDER = {"add": 0, "taint": 1, "shutdown": 2, "reclaim": 2}
"""At one time a change is a drop or a rise, never both; a notice may come at the moment its
slot is filled (changes closer than the notice's lead), so the node is added first."""


def plan(
    capacity: spot_traces.Trace, replicas: int, seed: int, share: float, lead: float
) -> list[Action]:
    """The actions that make a pool follow ``capacity``: a drop loses slots drawn by a seeded
    generator (the same in both pools), every ``1/share``-th loss with a notice ``lead``
    seconds ahead (no earlier than its slot was filled); a rise fills the lowest free slots."""
    rng = random.Random(seed)
    filled = {slot: 0.0 for slot in range(capacity.available(0))}
    actions: list[Action] = []
    lost = 0
    for t, before, after in capacity.changes():
        if after < before:
            for slot in sorted(rng.sample(sorted(filled), before - after)):
                noticed = math.floor((lost + 1) * share) > math.floor(lost * share)
                lost += 1
                if noticed:
                    actions.append(Action(max(t - lead, filled[slot]), "taint", slot))
                actions.append(Action(t, "shutdown" if noticed else "reclaim", slot))
                del filled[slot]
        for _ in range(max(0, after - before)):
            slot = min(set(range(replicas)) - set(filled))
            filled[slot] = t
            actions.append(Action(t, "add", slot))
    return sorted(actions, key=lambda a: (a.t, ORDER[a.kind], a.slot))


# -- the jobs ------------------------------------------------------------------------------------


def job_manifest(name: str, pool: str, cfg: Config, *, elastic: bool) -> Obj:
    """A ResumableTrainingJob of ``examples/train_deterministic.py`` pinned to one pool, one
    rank per node (20 of a pod-runner node's 32 CPUs), checkpointing to the stack's bucket.
    ``RTJ_PROGRESS_INTERVAL_SECONDS=0.5``: the operator sees a gang's first step (and counts
    ``stepsLost``) within half a second rather than the default 2."""
    secret = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": S3_SECRET, "key": key}}}
        for key in (
            "AWS_ENDPOINT_URL_S3",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
        )
    ]
    command = [
        "python",
        TRAINER,
        "--elastic",
        "--epochs=1000",
        f"--dataset-size={DATASET}",
        f"--batch-size={cfg.batch_size}",
        f"--interval={cfg.interval_steps}ba",
        "--workers=0",
        f"--step-sleep={cfg.step_sleep}",
        "--trace=/results/$(RTJ_RUN_NAME).trace",
    ]
    spec: Obj = {
        "replicas": cfg.replicas,
        "checkpoint": {"dir": "s3://rtj-checkpoints/runs"},
        "template": {
            "spec": {
                "terminationGracePeriodSeconds": 10,
                "nodeSelector": {"type": "podrunner", POOL_LABEL: pool},
                "containers": [
                    {
                        "name": "trainer",
                        "image": "rtj-train:0.1.0",
                        "workingDir": "/app",
                        "command": command,
                        "env": [
                            *secret,
                            {"name": "RTJ_LOCAL_CHECKPOINT_DIR", "value": "/scratch/checkpoints"},
                            {"name": "RTJ_PROGRESS_INTERVAL_SECONDS", "value": "0.5"},
                        ],
                        "resources": {"requests": {"cpu": "20", "memory": "512Mi"}},
                        "volumeMounts": [
                            {"name": "results", "mountPath": "/results"},
                            {"name": "scratch", "mountPath": "/scratch"},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "results", "persistentVolumeClaim": {"claimName": "rtj-results"}},
                    {"name": "scratch", "emptyDir": {}},
                ],
            }
        },
    }
    if cfg.survivors != "Replace":
        spec["recovery"] = {"survivors": cfg.survivors}
    if elastic and cfg.in_process_switch:
        spec["recovery"]["inProcessSwitch"] = True
        command.append("--in-process-switch")
    if elastic:
        spec["elastic"] = {
            "minReplicas": cfg.min_replicas,
            "shrinkAfterSeconds": cfg.shrink_after_s,
            "grow": {
                "minIntervalSeconds": cfg.grow_interval_s,
                "settleSeconds": cfg.grow_settle_s,
                "checkpointTimeoutSeconds": 60,
            },
        }
    return {
        "apiVersion": "resumable.dev/v1alpha1",
        "kind": "ResumableTrainingJob",
        "metadata": {"name": name},
        "spec": spec,
    }


RESULTS_CLAIM_DOC = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "rtj-results"},
    "spec": {
        "accessModes": ["ReadWriteMany"],
        "storageClassName": "",
        "resources": {"requests": {"storage": "1Gi"}},
    },
}


# -- the pools -----------------------------------------------------------------------------------


class PoolStack(LocalStack):
    """The local stack whose nodes register with a ``pool`` label, as a real node pool's do:
    no moment when a Ready node belongs to no pool (labelling after registration would leave
    one, and a scheduler pass in it sees a node that fits no job)."""

    def add_pool_node(self, pool: str) -> str:
        """Start one pod-runner agent registering its Node with ``pool=<pool>``; its name (not
        waited for: the trace says the capacity is back now, and its registration is part of
        what the job waits for)."""
        return self.add_node(wait=False, labels={POOL_LABEL: pool})


class Pool:
    """The pod-runner nodes of one job: slot -> Node."""

    def __init__(self, stack: PoolStack, name: str) -> None:
        self.stack, self.name = stack, name
        self.slots: dict[int, str] = {}

    def add(self, slot: int) -> str:
        """A new node in ``slot``."""
        node = self.stack.add_pool_node(self.name)
        self.slots[slot] = node
        return node


# -- the recorder --------------------------------------------------------------------------------


@dataclass
class JobRecord:
    """What the recorder saw of one job (wall-clock epoch seconds)."""

    ticks: list[tuple[float, int, str, int | None, bool, bool]] = field(default_factory=list)
    training_since: dict[int, float] = field(default_factory=dict)
    attempt_start: dict[int, float] = field(default_factory=dict)
    checkpoints: dict[tuple[str, int | None], Obj] = field(default_factory=dict)
    sizes: dict[int, Obj] = field(default_factory=dict)
    status: Obj = field(default_factory=dict)


class Recorder:
    """Polls the jobs' status and the namespace's pods every ``interval`` seconds from a thread.

    Status keeps only the current attempt's ``trainingSince``/``attemptStartTime`` and an ended
    attempt's pods are deleted, so what the analysis needs must be seen while it lasts."""

    def __init__(self, stack: LocalStack, jobs: list[str], interval: float, say: Say) -> None:
        self.stack, self.jobs, self.interval, self.say = stack, jobs, interval, say
        self.records = {job: JobRecord() for job in jobs}
        self.pods: dict[str, Obj] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="goodput-recorder", daemon=True)
        self._errors = 0

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except (ApiError, OSError) as err:  # an API hiccup must not end the replay
                self._errors += 1
                if self._errors <= 3:
                    self.say(f"recorder: poll failed ({err}); going on")
            self._stop.wait(self.interval)

    def poll(self) -> None:
        """One look at every job and pod."""
        for job in self.jobs:
            now = time.time()
            self._job(job, now, self.stack.job(job).get("status") or {})
        now = time.time()
        items = self.stack.kube.request(
            "GET",
            f"/api/v1/namespaces/{self.stack.cfg.namespace}/pods",
            params={"labelSelector": LABEL_JOB},
        )["items"]
        listed = set()
        for pod in items:
            listed.add(pod["metadata"]["name"])
            self._pod(pod)
        for name, seen in self.pods.items():
            if name not in listed and seen.get("gone") is None:
                seen["gone"] = now

    def _job(self, job: str, now: float, st: Obj) -> None:
        rec = self.records[job]
        rec.status = st
        attempt = int(st.get("attempt", 0))
        # A warm join's kept pods train on under their old membership until the switch.
        trains = st.get("trainingSince") or st.get("membershipPendingSince")
        training = bool(trains) and st.get("phase") == "Running"
        waiting = st.get("gangSize") is None and bool(st.get("capacityWaitSince"))
        tick = (now, attempt, str(st.get("phase")), st.get("gangSize"), training, waiting)
        if not rec.ticks or rec.ticks[-1][1:] != tick[1:]:
            rec.ticks.append(tick)
        if st.get("trainingSince"):
            rec.training_since.setdefault(attempt, gp.wall(st["trainingSince"]) or now)
        if st.get("attemptStartTime"):
            rec.attempt_start.setdefault(attempt, gp.wall(st["attemptStartTime"]) or now)
        for ck in st.get("knownCheckpoints") or []:
            rec.checkpoints.setdefault((ck["name"], ck.get("attempt")), ck)
        for size in st.get("sizeHistory") or []:
            rec.sizes[int(size["attempt"])] = size

    def _pod(self, pod: Obj) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        # A standby pod of no attempt yet (a spare, or one of a loss's lost places: Stay) is
        # no attempt's pod until an attempt keeps it (below).
        no_attempt = -1 if LABEL_ROLE in meta["labels"] else 0
        seen = self.pods.setdefault(
            meta["name"],
            {
                "job": meta["labels"].get(LABEL_JOB),
                "attempt": int(meta["labels"].get(LABEL_ATTEMPT, no_attempt)),
                "rank": int(meta["labels"].get(LABEL_RANK, 0)),
                "created": gp.wall(meta.get("creationTimestamp")),
            },
        )
        seen["node"] = spec.get("nodeName") or seen.get("node")
        # A pod kept by a later attempt (recovery.survivors: Stay) is relabelled into it: it
        # joined that attempt when its label changed (its creation, binding and start are older).
        attempt = int(meta["labels"].get(LABEL_ATTEMPT, no_attempt))
        if attempt != seen["attempt"] and attempt not in seen.setdefault("kept_into", {}):
            seen["kept_into"][attempt] = (int(meta["labels"].get(LABEL_RANK, 0)), time.time())
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "True":
                seen.setdefault("bound", gp.wall(cond.get("lastTransitionTime")))
        for cs in status.get("containerStatuses") or []:
            if cs.get("name") != "trainer":
                continue
            state = cs.get("state") or {}
            started = (state.get("running") or state.get("terminated") or {}).get("startedAt")
            if started:
                seen.setdefault("started", gp.wall(started))
            finished = (state.get("terminated") or {}).get("finishedAt")
            if finished:
                seen.setdefault("finished", gp.wall(finished))


# -- reading the ranks' and the bucket's records -------------------------------------------------


def trace_records(stack: LocalStack, job: str, ranks: int) -> dict[int, list[Obj]]:
    """Every rank's ``--trace`` records so far (a line being written is skipped)."""
    out: dict[int, list[Obj]] = {}
    for rank in range(ranks):
        path = stack.results_dir / f"{job}.trace.rank{rank}"
        records = []
        if path.exists():
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    records.append(json.loads(line))
        out[rank] = records
    return out


def committed_in_bucket(stack: LocalStack, job: str) -> list[Obj]:
    """The run's checkpoints whose manifest is in the bucket (committed remotely): what a new
    gang can resume from, so what the job has kept."""
    client = stack.s3.client()
    found = []
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=stack.cfg.bucket, Prefix=f"runs/{job}/"
    )
    for page in pages:
        for obj in page.get("Contents") or []:
            parts = obj["Key"].split("/")
            if len(parts) == 4 and parts[3] == "manifest.json":
                body = client.get_object(Bucket=stack.cfg.bucket, Key=obj["Key"])["Body"].read()
                found.append(commit_record(parts[2], json.loads(body)))
    return sorted(found, key=lambda m: m["sample"])


def commit_record(name: str, manifest: Obj) -> Obj:
    """What the figures read of one committed checkpoint's manifest."""
    return {
        "name": name,
        "sample": int(manifest["timestamp"]["sample"]),
        "step": int(manifest["timestamp"]["batch"]),
        "world_size": manifest.get("world_size"),
        "created_at": manifest.get("created_at"),
    }


def runtime_marks(
    stack: LocalStack, pod: str, after: float | None = None
) -> dict[str, float | None]:
    """The runtime's milestones in one pod's log (wall clock): interpreter start, manager built
    (process group formed), fetched, resumed (loaded), first step; only those after ``after``
    (a kept pod's log holds every attempt it served)."""
    marks: dict[str, float | None] = {}
    for event in stack.runtime_events(pod):
        at = gp.wall(event.time)
        if after is not None and (at is None or at < after):
            continue
        if event.type == events.STARTED:
            marks.setdefault("runtime_started", gp.wall(event.get("process_started")))
            marks.setdefault("process_group_formed", gp.wall(event.time))
        elif event.type == events.FETCHED:
            marks.setdefault("checkpoint_fetched", gp.wall(event.time))
        elif event.type == events.RESUMED:
            marks.setdefault("loaded", gp.wall(event.time))
        elif event.type == events.FIRST_STEP:
            marks.setdefault("first_step", gp.wall(event.time))
    return marks


# -- one replay ----------------------------------------------------------------------------------


def full_rate(checkpoints: list[Obj], attempt: int, skip_first: bool = True) -> float | None:
    """Samples per second of one attempt between its commits (the first left out: the gang's
    first interval includes its warm-up)."""
    own = sorted(
        (c for c in checkpoints if c.get("attempt") == attempt and c.get("time")),
        key=lambda c: c["sample"],
    )
    if skip_first:
        own = own[1:]
    if len(own) < 2:
        return None
    t0, t1 = gp.wall(own[0]["time"]), gp.wall(own[-1]["time"])
    if t0 is None or t1 is None or t1 <= t0:
        return None
    return (own[-1]["sample"] - own[0]["sample"]) / (t1 - t0)


def rates_by_size(checkpoints: list[Obj], sizes: dict[int, int]) -> dict[int, float]:
    """Per gang size, the median per-node rate of the attempts that ran at it and committed at
    least three times (the linear-scaling check: equal at every size)."""
    by_size: dict[int, list[float]] = {}
    for attempt, size in sizes.items():
        rate = full_rate(checkpoints, attempt)
        if rate is not None and size:
            by_size.setdefault(size, []).append(rate / size)
    return {size: round(statistics.median(v), 4) for size, v in sorted(by_size.items())}


class Replay:
    """One replay of the window on a running stack: both pools, both jobs, the recorder."""

    kinds: tuple[str, ...] = ("fixed", "elastic")
    """The jobs, one per pool."""

    def __init__(self, stack: PoolStack, cfg: Config, index: int, say: Say) -> None:
        self.stack, self.cfg, self.say = stack, cfg, say
        self.capacity = cfg.capacity()
        lead = cfg.notice_s / cfg.compress
        self.actions = plan(self.capacity, cfg.replicas, cfg.seed, cfg.notice_share, lead)
        self.jobs = {kind: f"gp{index}-{kind}" for kind in self.kinds}
        self.pools = {kind: Pool(stack, kind) for kind in self.jobs}
        self.losses: list[gp.Loss] = []
        self.t0 = 0.0
        self._threads: list[threading.Thread] = []

    # -- setting up ---------------------------------------------------------------------------

    def _nodes_up(self) -> None:
        start = self.capacity.available(0)
        if start != self.cfg.replicas:
            raise SystemExit(
                f"the window starts at {start} of {self.cfg.replicas} nodes: choose one that "
                "starts at full size (the full gang's rate is measured before it opens)"
            )
        added = [pool.add(slot) for pool in self.pools.values() for slot in range(start)]
        for node in added:
            wait_for(f"node {node} Ready", lambda node=node: self.stack.kube.node_ready(node), 60)

    def _apply(self) -> None:
        docs = [RESULTS_CLAIM_DOC] + [
            job_manifest(name, kind, self.cfg, elastic=kind == "elastic")
            for kind, name in self.jobs.items()
        ]
        self.stack.kubectl(
            "apply", "-n", self.stack.cfg.namespace, "-f", "-", stdin=yaml.safe_dump_all(docs)
        )

    def _calibrated(self, rec: Recorder) -> dict[str, float] | None:
        """Each job's full-gang rate (samples/s) once both have committed ``warmup_commits``
        times in their first attempt; None until then."""
        rates = {}
        for kind, job in self.jobs.items():
            r = rec.records[job]
            own = [c for c in r.checkpoints.values() if c.get("attempt") == 0]
            if r.status.get("attempt", 0) != 0:
                raise RuntimeError(
                    f"{job} restarted before the window opened (attempt "
                    f"{r.status.get('attempt')}): its full-gang rate is measured on its first "
                    "attempt, at full size. An elastic job with --shrink-after 0 starts with the "
                    "nodes registered so far and grows later; give it a few seconds."
                )
            if len(own) < self.cfg.warmup_commits:
                return None
            rate = full_rate(own, 0)
            if rate is None:
                return None
            rates[kind] = rate
        return rates

    # -- the replay ---------------------------------------------------------------------------

    def _loss(
        self, pool: Pool, slot: int, kind: str, tainted: dict[tuple[str, int], float]
    ) -> None:
        node = pool.slots.pop(slot)
        at = time.time() - self.t0
        self.losses.append(
            gp.Loss(at, node, pool.name, slot, kind == "shutdown", tainted.get((pool.name, slot)))
        )
        if kind == "shutdown":
            self._spawn(lambda: self.stack.shut_down_node(node, timeout=90))
        else:
            self._spawn(lambda: self.stack.reclaim_node(node))

    def _taint(self, pool: Pool, slot: int, tainted: dict[tuple[str, int], float]) -> None:
        node = pool.slots[slot]
        tainted[(pool.name, slot)] = time.time() - self.t0

        def taint() -> None:
            wait_for(
                f"node {node} registered", lambda: self.stack.kube.get(f"/api/v1/nodes/{node}"), 30
            )
            self.stack.taint_node(node, TAINT, "NoSchedule", "true")

        self._spawn(taint)

    def _spawn(self, fn: Callable[[], None]) -> None:
        def guarded() -> None:
            try:
                fn()
            except Exception as err:  # reported; the replay goes on
                self.say(f"  node action failed: {err}")

        thread = threading.Thread(target=guarded, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _execute(self) -> None:
        """Do the plan on both pools at the trace's times."""
        tainted: dict[tuple[str, int], float] = {}
        for action in self.actions:
            delay = self.t0 + action.t - time.time()
            if delay > 0:
                time.sleep(delay)
            for pool in self.pools.values():
                if action.kind == "add":
                    pool.add(action.slot)
                elif action.kind == "taint":
                    self._taint(pool, action.slot, tainted)
                else:
                    self._loss(pool, action.slot, action.kind, tainted)
            self.say(
                f"[{time.time() - self.t0:6.1f}s] {action.kind} slot {action.slot} "
                f"(capacity {self.capacity.available(action.t)})"
            )
        delay = self.t0 + self.capacity.duration - time.time()
        if delay > 0:
            time.sleep(delay)

    def run(self) -> Obj:
        """Nodes, jobs, warm-up until each job's full-gang rate is measured, the window, the
        records at its end; the analysis of both jobs."""
        cfg, stack = self.cfg, self.stack
        self.say(
            f"replay: {self.capacity.name}, {len(self.capacity.changes())} changes in "
            f"{self.capacity.duration:.0f} s; jobs {', '.join(self.jobs.values())}"
        )
        self._nodes_up()
        self._apply()
        with Recorder(stack, list(self.jobs.values()), cfg.poll_s, self.say) as rec:
            rates = wait_for(
                "both jobs' full-gang rate (commits before the window)",
                lambda: self._calibrated(rec),
                600,
                interval=1.0,
                on_timeout=lambda: stack.diagnostics(self.jobs["fixed"]),
            )
            self.t0 = time.time()
            accounts = {kind: [self._account(job)] for kind, job in self.jobs.items()}
            start = {
                kind: gp.read_work(trace_records(stack, job, cfg.replicas))
                for kind, job in self.jobs.items()
            }
            self.say(
                "window opens: full-gang rate "
                + ", ".join(f"{k} {v:.2f} samples/s" for k, v in rates.items())
            )
            self._execute()
            end = time.time()
            for kind, job in self.jobs.items():
                accounts[kind].append(self._account(job))
            kept = {kind: self._committed(job) for kind, job in self.jobs.items()}
            work = {
                kind: gp.read_work(trace_records(stack, job, cfg.replicas))
                for kind, job in self.jobs.items()
            }
        self.say(f"window closed after {end - self.t0:.1f} s")
        for thread in self._threads:
            thread.join(120)
        return {
            kind: self._analyse(
                kind,
                rec=rec,
                rate=rates[kind],
                start=start[kind],
                kept=kept[kind],
                work=work[kind],
                account=gp.account_window(*accounts[kind], self.t0, end),
            )
            for kind in self.jobs
        }

    def _committed(self, job: str) -> list[Obj]:
        """The job's committed checkpoints, oldest first."""
        return committed_in_bucket(self.stack, job)

    def _account(self, job: str) -> Obj | None:
        """The operator's own goodput account of the job now (``status.goodput``)."""
        return (self.stack.job(job).get("status") or {}).get("goodput")

    def cleanup(self) -> None:
        """Delete the jobs and take every node of both pools away (the next replay starts
        afresh)."""
        for job in self.jobs.values():
            with contextlib.suppress(Exception):
                self.stack.kubectl(
                    "delete", "rtj", job, "-n", self.stack.cfg.namespace, "--wait=false"
                )
        for pool in self.pools.values():
            for node in list(pool.slots.values()):
                with contextlib.suppress(Exception):
                    self.stack.reclaim_node(node)
            pool.slots.clear()
        with contextlib.suppress(Exception):
            wait_for(
                "the replay's pods gone",
                lambda: not any(self.stack.pods(job) for job in self.jobs.values()),
                120,
                interval=1.0,
            )

    # -- the figures --------------------------------------------------------------------------

    def _analyse(
        self,
        kind: str,
        *,
        rec: Recorder,
        rate: float,
        start: dict[int, gp.AttemptWork],
        kept: list[Obj],
        work: dict[int, gp.AttemptWork],
        account: Obj,
    ) -> Obj:
        """Every figure of one job, and the records they come from."""
        job = self.jobs[kind]
        r = rec.records[job]
        need = self.cfg.min_replicas if kind == "elastic" else self.cfg.replicas
        ticks = [gp.Tick(w - self.t0, a, p, s, tr, wa) for w, a, p, s, tr, wa in r.ticks]
        free = gp.schedulable(
            self.capacity,
            [(x.tainted_at, x.t) for x in self.losses if x.pool == kind and x.tainted_at],
        )
        pods = self._pods(rec, job)
        losses = {loss.node: loss for loss in self.losses if loss.pool == kind}
        recoveries, restarts = self._recoveries(
            r, pods=pods, losses=losses, ticks=ticks, work=work, need=need, free=free
        )
        elastic = kind == "elastic"
        return {
            "job": job,
            "kind": kind,
            "replicas": self.cfg.replicas,
            "min_replicas": need,
            **self._accounting(
                r, rate=rate, start=start, kept=kept, work=work, ticks=ticks, free=free, need=need
            ),
            "operator_account": account,
            **_interruption_figures(recoveries, restarts),
            **(self._elastic_answers(r, work) if elastic else {"partial_starts": [], "grows": []}),
            **self._raw(kind, r, ticks, pods),
        }

    def _accounting(
        self,
        r: JobRecord,
        *,
        rate: float,
        start: dict[int, gp.AttemptWork],
        kept: list[Obj],
        work: dict[int, gp.AttemptWork],
        ticks: list[gp.Tick],
        free: spot_traces.Trace,
        need: int,
    ) -> Obj:
        """Goodput, the ceiling, and where the rest of the ideal went (samples, and seconds of
        the full gang)."""
        replicas, end = self.cfg.replicas, self.capacity.duration
        rate_node = rate / replicas
        first = max(start, default=0)
        s0 = start[first].last_sample if first in start else 0
        kept_sample = max((m["sample"] for m in kept), default=0)
        ideal = gp.ideal_node_seconds(self.capacity, replicas) * rate_node
        kept_samples = kept_sample - s0
        cats = gp.categorize(ticks, self.capacity, replicas, need, free)
        trained = gp.trained_in_window(work, {first: s0}, first)
        lost = {
            "below_minimum": cats["below_minimum"] * rate_node,
            "under_notice": cats["under_notice"] * rate_node,
            "waiting_for_full_gang": cats["waiting"] * rate_node,
            "restarting": cats["restarting"] * rate_node,
            "below_capacity": cats["below_capacity"] * rate_node,
            "slower_steps": cats["training"] * rate_node - trained,
            "rolled_back": trained - kept_samples,
        }
        latest = max(work.values(), key=lambda w: w.attempt, default=None)
        sizes = {a: int(s["size"]) for a, s in r.sizes.items()}
        return {
            "goodput": round(kept_samples / ideal, 4) if ideal else None,
            "ceiling": round(gp.ceiling(self.capacity, replicas, need), 4),
            "ideal_samples": round(ideal, 1),
            "kept_samples": kept_samples,
            "start_samples": s0,
            "kept_checkpoint": kept[-1] if kept else None,
            "full_gang_rate": round(rate, 3),
            "rate_per_node_by_size": rates_by_size(list(r.checkpoints.values()), sizes),
            "capacity_changes": len(self.capacity.changes()),
            "time_without_training_s": round(cats["idle_s"], 1),
            "goodput_dedicated": round(kept_samples / (rate * end), 4),
            "lost_samples": {k: round(v, 1) for k, v in lost.items()},
            "lost_full_gang_s": {k: round(v / (rate_node * replicas), 1) for k, v in lost.items()},
            "uncommitted_at_end_samples": (
                max(0, latest.last_sample - kept_sample) if latest else 0
            ),
            "trained_samples": trained,
        }

    def _elastic_answers(self, r: JobRecord, work: dict[int, gp.AttemptWork]) -> Obj:
        """Did a gang start small while capacity was still coming back; was a gang grown that
        had not trained."""
        first_steps = {a: (w - self.t0) for a, w in r.training_since.items()}
        starts = [
            {
                "size": s["size"],
                "attempt": a,
                "t": (gp.wall(s.get("startTime")) or self.t0) - self.t0,
            }
            for a, s in sorted(r.sizes.items())
        ]
        ended = [
            {**i, "t": (gp.wall(i["time"]) or 0) - self.t0}
            for i in r.status.get("interruptions") or []
        ]
        return {
            "partial_starts": gp.partial_starts(
                starts, self.capacity, self.cfg.replicas, first_steps, self.capacity.duration
            ),
            "grows": gp.grows_untrained(ended, first_steps, work),
        }

    def _raw(
        self, kind: str, r: JobRecord, ticks: list[gp.Tick], pods: dict[int, list[gp.PodSeen]]
    ) -> Obj:
        """The records the figures come from, on the window's clock (to check or recompute)."""
        return {
            "size_history": [
                {k: s.get(k) for k in ("attempt", "size", "reason", "stepsLost")}
                for _, s in sorted(r.sizes.items())
            ],
            "losses": [asdict(x) for x in self.losses if x.pool == kind],
            "ticks": [
                [round(k.t, 2), k.attempt, k.phase, k.size, k.training, k.waiting] for k in ticks
            ],
            "pods": {
                a: [
                    {k: _round(v) if isinstance(v, float) else v for k, v in asdict(p).items()}
                    for p in sorted(ps, key=lambda p: p.rank)
                ]
                for a, ps in sorted(pods.items())
            },
        }

    def _pods(self, rec: Recorder, job: str) -> dict[int, list[gp.PodSeen]]:
        """The job's pods by attempt, on the window's clock."""
        out: dict[int, list[gp.PodSeen]] = {}

        def shift(value: float | None) -> float | None:
            return None if value is None else value - self.t0

        for name, seen in rec.pods.items():
            if seen["job"] != job:
                continue
            for attempt, (rank, joined) in (seen.get("kept_into") or {}).items():
                out.setdefault(attempt, []).append(
                    gp.PodSeen(
                        name,
                        attempt,
                        rank,
                        seen.get("node"),
                        shift(joined),
                        shift(joined),
                        shift(joined),
                        shift(seen.get("finished")),
                        shift(seen.get("gone")),
                    )
                )
            if seen["attempt"] < 0:
                continue  # a standby pod no attempt kept
            out.setdefault(seen["attempt"], []).append(
                gp.PodSeen(
                    name,
                    seen["attempt"],
                    seen["rank"],
                    seen.get("node"),
                    shift(seen.get("created")),
                    shift(seen.get("bound")),
                    shift(seen.get("started")),
                    shift(seen.get("finished")),
                    shift(seen.get("gone")),
                )
            )
        return out

    def _recoveries(
        self,
        r: JobRecord,
        *,
        pods: dict[int, list[gp.PodSeen]],
        losses: dict[str, gp.Loss],
        ticks: list[gp.Tick],
        work: dict[int, gp.AttemptWork],
        need: int,
        free: spot_traces.Trace,
    ) -> tuple[list[gp.Recovery], list[gp.Recovery]]:
        """Each interruption in the window: those a loss of ours caused, and the operator's own
        restarts (grows, re-shrinks)."""
        end = self.capacity.duration
        ended = {int(i["attempt"]) for i in r.status.get("interruptions") or []}
        by_loss, own = [], []
        for item in r.status.get("interruptions") or []:
            detected = (gp.wall(item["time"]) or 0) - self.t0
            if not 0 <= detected <= end + 1:
                continue
            a, b = int(item["attempt"]), int(item["attempt"]) + 1
            old, new = pods.get(a, []), pods.get(b, [])
            nodes = {p.node for p in old}
            candidates = [x for x in losses.values() if x.node in nodes and x.t <= detected + 1]
            # Nodes lost together: the one the operator named, else the first.
            named = [x for x in candidates if x.node == item.get("node")]
            loss = min(named or candidates, key=lambda x: x.t) if candidates else None
            if item.get("cause") in ("Grow", "Unschedulable"):
                loss = None
            runtime: dict[str, list[float | None]] = {}
            for pod in new:
                marks = runtime_marks(self.stack, pod.name, after=detected + self.t0)
                for name, at in marks.items():
                    if name != "first_step" or pod.rank == 0:
                        runtime.setdefault(name, []).append(None if at is None else at - self.t0)
            created = r.attempt_start.get(b)
            recovery = gp.Recovery(
                attempt=a,
                cause=str(item.get("cause")),
                detected=detected,
                loss=loss,
                milestones=gp.milestones(
                    old,
                    new,
                    detected=detected,
                    created=None if created is None else created - self.t0,
                    runtime=runtime,
                    losses=losses,
                ),
                next_size=len(new) or None,
                steps_lost_status=item.get("stepsLost"),
            )
            recovery.waits = gp.waiting_spans(ticks, free, len(new) or need, end)
            recovery.until = end
            steps, samples = gp.ranks_lost(work, a, b)
            recovery.steps_lost_ranks, recovery.samples_lost_ranks = steps, samples
            recovery.last_committed_step = item.get("lastCommittedStep")
            recovery.next_resumed_at_sample = work[b].resumed_at if b in work else None
            recovery.outcome = (
                "trained"
                if recovery.milestones.get("first_step") is not None
                else "interrupted again"
                if b in ended
                else "not trained in the window"
            )
            (by_loss if loss is not None or item.get("preemption") else own).append(recovery)
        return by_loss, own


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _interruption_figures(recoveries: list[gp.Recovery], restarts: list[gp.Recovery]) -> Obj:
    """Counts and medians of one job's interruptions (a lost node's) and restarts (those and the
    operator's own), each recovery in full, and the phase table of the loss-caused ones."""
    return {
        "interruptions": sum(1 for x in recoveries if x.loss is not None),
        "restarts": len(recoveries) + len(restarts),
        "median_recovery_s": _round(gp.median(x.recovery_s for x in recoveries)),
        "median_recovery_less_waits_s": _round(
            gp.median(
                None if x.recovery_s is None else x.recovery_s - x.waited_s for x in recoveries
            )
        ),
        "recoveries": [_recovery_doc(x) for x in recoveries],
        "operator_restarts": [_recovery_doc(x) for x in restarts],
        "phases": gp.phase_table([x for x in recoveries if x.loss is not None]),
    }


def _recovery_doc(r: gp.Recovery) -> Obj:
    start = r.start
    return {
        "attempt": r.attempt,
        "cause": r.cause,
        "loss": None if r.loss is None else asdict(r.loss),
        "detected_s": round(r.detected, 2),
        "since_start_s": {
            k: None if v is None else round(v - start, 2) for k, v in r.milestones.items()
        },
        "phase_costs_s": {k: round(v, 2) for k, v in gp.phase_costs(r).items()},
        "recovery_s": _round(r.recovery_s),
        "outcome": r.outcome,
        "waited_s": round(r.waited_s, 2),
        "next_size": r.next_size,
        "steps_lost_status": r.steps_lost_status,
        "steps_lost_ranks": r.steps_lost_ranks,
        "samples_lost_ranks": r.samples_lost_ranks,
        "last_committed_step": r.last_committed_step,
        "next_resumed_at_sample": r.next_resumed_at_sample,
    }


# -- several replays, the summary, the output ----------------------------------------------------


def run_replays(stack: PoolStack, cfg: Config, say: Say) -> list[Obj]:
    """``cfg.repeat`` replays on one stack, one after the other."""
    runs = []
    for index in range(cfg.repeat):
        replay = Replay(stack, cfg, index, say)
        try:
            result = replay.run()
        finally:
            replay.cleanup()
        runs.append(result)
        print_run(result, say)
    return runs


def all_recoveries_phases(runs: list[Obj]) -> dict[str, Obj]:
    """The phase table over every loss-caused recovery of every run and job (recomputed from
    the recoveries' own costs, so the medians are over all of them)."""
    costs: dict[str, list[float]] = {p: [] for p in gp.PHASES}
    since: dict[str, list[float]] = {p: [] for p in gp.PHASES}
    for run in runs:
        for job in run.values():
            for rec in job["recoveries"]:
                if rec["loss"] is None:
                    continue
                for name, v in rec["phase_costs_s"].items():
                    costs[name].append(v)
                for name, v in rec["since_start_s"].items():
                    if v is not None:
                        since[name].append(v)
    return {
        name: {
            "p50": None if not costs[name] else round(statistics.median(costs[name]), 3),
            "since_loss_p50": None if not since[name] else round(statistics.median(since[name]), 3),
            "n": len(costs[name]),
            "source": gp.SOURCES[name],
        }
        for name in gp.PHASES
    }


def summary(runs: list[Obj]) -> dict[str, Obj]:
    """Per job kind, the median over runs of each figure of the table."""
    keys = (
        "goodput",
        "ceiling",
        "capacity_changes",
        "interruptions",
        "restarts",
        "time_without_training_s",
        "median_recovery_s",
        "median_recovery_less_waits_s",
    )
    out: dict[str, Obj] = {}
    for kind in runs[0] if runs else ():
        jobs = [run[kind] for run in runs]
        out[kind] = {k: _round(gp.median(j.get(k) for j in jobs), 4) for k in keys}
        out[kind]["goodput_runs"] = [j["goodput"] for j in jobs]
        out[kind]["goodput_dedicated"] = _round(gp.median(j["goodput_dedicated"] for j in jobs), 4)
        out[kind]["operator_window_fraction"] = _round(
            gp.median((j.get("operator_account") or {}).get("window_fraction") for j in jobs), 4
        )
        out[kind]["lost_full_gang_s"] = {
            k: _round(gp.median(j["lost_full_gang_s"][k] for j in jobs), 1)
            for k in jobs[0]["lost_full_gang_s"]
        }
    return out


def table(rows: dict[str, Obj]) -> str:
    """The figures of record, one line per job."""
    head = (
        f"{'job':<8} {'goodput':>8} {'ceiling':>8} {'changes':>8} {'interr.':>8} "
        f"{'restarts':>8} {'no training':>12} {'recovery p50':>13} {'less waits':>11}"
    )
    lines = [head]
    for kind, r in rows.items():
        lines.append(
            f"{kind:<8} {_fmt(r['goodput'], '.3f'):>8} {_fmt(r['ceiling'], '.3f'):>8} "
            f"{_fmt(r['capacity_changes'], '.0f'):>8} {_fmt(r['interruptions'], '.0f'):>8} "
            f"{_fmt(r['restarts'], '.0f'):>8} "
            f"{_fmt(r['time_without_training_s'], '.0f') + ' s':>12} "
            f"{_fmt(r['median_recovery_s'], '.1f') + ' s':>13} "
            f"{_fmt(r['median_recovery_less_waits_s'], '.1f') + ' s':>11}"
        )
    return "\n".join(lines)


def phases_text(phases: dict[str, Obj]) -> str:
    """The phase table: own cost (critical path, waits out) and time since the loss."""
    lines = [f"{'phase':<22} {'p50 own':>8} {'p50 since loss':>15} {'n':>3}  source"]
    for name, p in phases.items():
        since = p.get("since_loss_p50", p.get("since_start_p50"))
        lines.append(
            f"{name:<22} {_fmt(p['p50'], '.2f'):>8} {_fmt(since, '.2f'):>15} {p['n']:>3}  "
            f"{p['source']}"
        )
    return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_run(run: Obj, say: Say) -> None:
    """One replay's table, time lost per cause, and the elastic job's answers."""
    say(table(run))
    for kind, r in run.items():
        acc = r.get("operator_account") or {}
        say(
            f"{kind}: against dedicated nodes {r['goodput_dedicated']:.3f}; the operator's "
            f"status.goodput over the window {_fmt(acc.get('window_fraction'), '.3f')} "
            f"(rate {acc.get('full_size_rate')} {acc.get('rate_source')}), changes "
            f"{acc.get('delta')}"
        )
        lost = ", ".join(f"{k} {v:.0f}" for k, v in r["lost_full_gang_s"].items())
        say(f"{kind}: lost (full-gang seconds): {lost}")
        for rec in r["recoveries"]:
            took = (
                f"recovery {rec['recovery_s']:.1f} s"
                if rec["recovery_s"] is not None
                else f"next gang {rec['outcome']}"
            )
            say(
                f"  {kind} attempt {rec['attempt']} ({rec['cause']}): {took} ({rec['waited_s']:.1f}"
                f" s waiting), stepsLost status {rec['steps_lost_status']} / ranks "
                f"{rec['steps_lost_ranks']}"
            )
    elastic = run.get("elastic") or {}
    for start in elastic.get("partial_starts", []):
        say(f"  elastic partial start: {start}")
    for grow in elastic.get("grows", []):
        say(f"  elastic grow: {grow}")


def source_commit() -> str:
    """The commit measured, with ``+dirty`` when the working tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


REPLAY_FIELDS = {
    "trace": "trace",
    "window_start": "window_start",
    "window": "window",
    "compress": "compress",
    "replicas": "replicas",
    "min_replicas": "min_replicas",
    "step_sleep": "step_sleep",
    "notice_share": "notice_share",
    "shrink_after": "shrink_after_s",
}
"""The flags of ``add_replay_args`` (their argparse names) and the ``Config`` fields they set."""
MORE_FIELDS = {
    "interval_steps": "interval_steps",
    "notice_s": "notice_s",
    "seed": "seed",
    "grow_interval": "grow_interval_s",
    "grow_settle": "grow_settle_s",
    "repeat": "repeat",
    "survivors": "survivors",
    "in_process_switch": "in_process_switch",
}
"""The pod-runner replay's other flags and their ``Config`` fields."""


def fields_of(args: argparse.Namespace, names: dict[str, str]) -> dict[str, Any]:
    """``Config`` fields from parsed flags: ``names`` maps each flag's name to its field."""
    return {field_name: getattr(args, flag) for flag, field_name in names.items()}


def add_replay_args(p: argparse.ArgumentParser, defaults: Config) -> None:
    """The flags every replay takes (this one and ``goodput_realnodes.py``): the window, the
    job's size and the emulated trainer."""
    p.add_argument("--trace", default=defaults.trace, help="a spot_traces name")
    p.add_argument(
        "--window-start", type=float, default=defaults.window_start, help="trace seconds"
    )
    p.add_argument("--window", type=float, default=defaults.window, help="trace seconds")
    p.add_argument("--compress", type=float, default=defaults.compress, help="trace s per replay s")
    p.add_argument("--replicas", type=int, default=defaults.replicas)
    p.add_argument("--min-replicas", type=int, default=defaults.min_replicas)
    p.add_argument("--step-sleep", type=float, default=defaults.step_sleep)
    p.add_argument("--notice-share", type=float, default=defaults.notice_share)
    p.add_argument("--shrink-after", type=int, default=defaults.shrink_after_s)


def replay_config(
    p: argparse.ArgumentParser, args: argparse.Namespace, base: Config, **more: Any
) -> Config:
    """``base`` with the flags of ``add_replay_args`` (and ``more``), checked: a bad value
    ends the command with the flag and what it expects."""
    checks = [
        (args.window > 0, "--window must be > 0 trace seconds"),
        (args.window_start >= 0, "--window-start must be >= 0 trace seconds"),
        (args.compress > 0, "--compress must be > 0 (trace seconds per replay second)"),
        (args.replicas >= 1, "--replicas must be >= 1"),
        (1 <= args.min_replicas <= args.replicas, "--min-replicas must be 1 to --replicas"),
        (args.step_sleep > 0, "--step-sleep must be > 0 seconds"),
        (0 <= args.notice_share <= 1, "--notice-share must be between 0 and 1"),
        (args.shrink_after >= 0, "--shrink-after must be >= 0 seconds"),
    ]
    for ok, problem in checks:
        if not ok:
            p.error(problem)
    cfg = replace(base, **fields_of(args, REPLAY_FIELDS), **more)
    try:
        cfg.capacity()
    except (KeyError, OSError, ValueError) as err:  # an unknown trace, unfetched, a bad window
        p.error(f"--trace {args.trace!r} (--window-start, --window): {err}")
    return cfg


def parse_args(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = Config()
    add_replay_args(p, defaults)
    p.add_argument("--interval-steps", type=int, default=defaults.interval_steps)
    p.add_argument("--notice-s", type=float, default=defaults.notice_s, help="trace seconds")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--grow-interval", type=int, default=defaults.grow_interval_s)
    p.add_argument("--grow-settle", type=int, default=defaults.grow_settle_s)
    p.add_argument("--repeat", type=int, default=defaults.repeat)
    p.add_argument(
        "--survivors",
        choices=("Replace", "Stay"),
        default=defaults.survivors,
        help="both jobs' spec.recovery.survivors",
    )
    p.add_argument(
        "--in-process-switch",
        action="store_true",
        help="with --survivors Stay: the elastic job's grows switch its workers in process",
    )
    p.add_argument("--json", help="write the runs, the summary and the phase costs here")
    p.add_argument("--cluster-name", default="rtj-goodput")
    p.add_argument("--keep-workdir", action="store_true", help="keep logs and pod folders")
    args = p.parse_args(argv)
    if args.interval_steps < 1 or args.repeat < 1 or args.notice_s < 0:
        p.error("--interval-steps and --repeat must be >= 1, --notice-s >= 0")
    if args.in_process_switch and args.survivors != "Stay":
        p.error("--in-process-switch needs --survivors Stay")
    cfg = replay_config(p, args, defaults, **fields_of(args, MORE_FIELDS))
    return cfg, args


def document(cfg: Config, runs: list[Obj]) -> Obj:
    """The JSON of record. Its top-level ``phases`` (each measured phase's median own cost) is
    what ``goodput_sim.py --costs`` reads; ``phase_table`` adds the time since the loss, the
    count and each timestamp's source."""
    capacity = cfg.capacity()
    table_of_phases = all_recoveries_phases(runs)
    return {
        "benchmark": "goodput",
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "commit": source_commit(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "config": asdict(cfg),
        "capacity": {
            "name": capacity.name,
            "duration_s": capacity.duration,
            "changes": [[round(t, 2), a, b] for t, a, b in capacity.changes()],
        },
        "summary": summary(runs),
        "phases": {
            name: {"p50": row["p50"], "n": row["n"]}
            for name, row in table_of_phases.items()
            if row["p50"] is not None
        },
        "phase_table": table_of_phases,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="rtj-goodput-"))

    def say(line: str) -> None:
        """Narration, without this machine's paths (the log is kept with the results)."""
        text = line.replace(str(workdir), "<workdir>").replace(str(Path.home()), "~")
        print(text, flush=True)

    capacity = cfg.capacity()
    say(
        f"trace {cfg.trace} [{cfg.window_start:g} s + {cfg.window:g} s] /{cfg.compress:g}: "
        f"{len(capacity.changes())} changes in {capacity.duration:.0f} s: "
        + ", ".join(f"{t:.0f}s {a}->{b}" for t, a, b in capacity.changes())
    )
    stack_cfg = StackConfig(
        workdir=workdir, cluster_name=args.cluster_name, namespace="rtj-goodput", nodes=0, say=say
    )
    try:
        with PoolStack(stack_cfg) as stack:
            runs = run_replays(stack, cfg, say)
    finally:
        if not args.keep_workdir:
            subprocess.run(["rm", "-rf", str(workdir)], check=False)
    report(document(cfg, runs), say, args.json)
    return 0


def report(doc: Obj, say: Say, json_path: str | None) -> None:
    """The table of record and the phase table; the JSON of record written to ``json_path``."""
    say("\n" + table(doc["summary"]))
    say(
        "\nrecovery phases (all loss-caused interruptions, seconds):\n"
        + phases_text(doc["phase_table"])
    )
    if json_path:
        Path(json_path).write_text(json.dumps(doc, indent=1) + "\n")
        say(f"\nwritten: {json_path} (also a goodput_sim.py --costs file)")


if __name__ == "__main__":
    interrupt.run(main)
