"""Real public spot-capacity traces, and the one model of a trace the project uses.

    python benchmarks/spot_traces.py list
    python benchmarks/spot_traces.py stats [--nodes 4 16 64 256]
    python benchmarks/spot_traces.py fetch     # the SkyPilot files, into the user's cache

A trace is a step function: ``points`` are ``(seconds since trace start, nodes available)``,
sorted; each value holds until the next point, and the LAST point marks the end of the trace
(its value holds for no time). Everything that replays capacity (the goodput simulator, the
on-cluster replay) takes a ``Trace`` from here, so a "change", a "window" or the scaling of a
small pool to a large gang mean the same thing everywhere.

Sources (``benchmarks/traces/README.md`` has the commits and licenses):

- ``skypilot/...``: skypilot-org/spot-traces (AWS ``p3.2xlarge``, one V100 per node; JSON, one
  sample per 5 minutes): the 4-node preemption traces and the 16-node availability traces. That
  repository carries no license, so its files are NOT shipped here: ``fetch`` downloads them at
  the pinned commit (each file checked against its git blob id) into the user's cache, or
  ``RTJ_SKYPILOT_TRACES`` names a checkout of the repository.
- ``bamboo/...``: uclasystem/bamboo ``doc/data`` (AWS ``g4dn.xlarge`` and ``p2.xlarge``; CSV
  ``seconds,instances`` written for plotting, so each change is two rows at the same time). MIT
  licensed: shipped in ``benchmarks/traces/bamboo``.

Synthetic traces (a Poisson process of losses) were rejected as the benchmark of record: real
capacity is bursty and mostly all or nothing, which a memoryless model hides.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import itertools
import json
import math
import os
import sys
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

TRACES_DIR = Path(__file__).resolve().parent / "traces"
SKYPILOT_ENV = "RTJ_SKYPILOT_TRACES"
"""A checkout of skypilot-org/spot-traces to read the SkyPilot files from, instead of the cache
that ``fetch`` fills."""

SKYPILOT_REPO = "skypilot-org/spot-traces"
SKYPILOT_COMMIT = "221da1ab9bdfe7966da296265d7694d52dc0c5a6"
BAMBOO_REPO = "uclasystem/bamboo"
BAMBOO_COMMIT = "80809293289419d40a870b4a9ccb8df0082ce3fb"


class TraceError(ValueError):
    """A trace file that cannot be read as a trace; the message names the file and line."""


class TraceMissingError(FileNotFoundError):
    """A known trace whose file is not on this machine; the message says how to get it."""


@dataclass(frozen=True)
class Trace:
    """Nodes available over time: a step function that ends at its last point."""

    name: str
    source: str
    points: tuple[tuple[float, int], ...]

    def __post_init__(self) -> None:
        if not self.points:
            raise ValueError(f"trace {self.name!r}: no points (a trace needs at least its start)")
        if self.points[0][0] != 0:
            raise ValueError(
                f"trace {self.name!r}: first point at t={self.points[0][0]}, not 0 "
                "(times are seconds since the trace's start)"
            )
        for (t0, _), (t1, n1) in itertools.pairwise(self.points):
            if t1 < t0:
                raise ValueError(f"trace {self.name!r}: times go backwards at t={t1}")
            if n1 < 0:
                raise ValueError(f"trace {self.name!r}: {n1} nodes at t={t1}")
        if self.points[0][1] < 0:
            raise ValueError(f"trace {self.name!r}: {self.points[0][1]} nodes at t=0")

    @property
    def duration(self) -> float:
        """Seconds from the start to the last point (the end)."""
        return self.points[-1][0]

    @property
    def peak(self) -> int:
        """The most nodes ever available: the size of the pool the trace was taken from."""
        return max(n for _, n in self.points)

    def available(self, t: float) -> int:
        """Nodes available at ``t`` (at a change, the value after it)."""
        if t < 0:
            raise ValueError(f"t={t}: before the trace's start (0)")
        i = bisect.bisect_right(self._times, t) - 1
        return self.points[i][1]

    def window(self, start_s: float, duration_s: float) -> Trace:
        """The part ``[start_s, start_s + duration_s]`` (clipped at the end), re-based to 0."""
        if not 0 <= start_s <= self.duration:
            raise ValueError(f"start_s={start_s}: outside the trace (0 to {self.duration})")
        if duration_s < 0:
            raise ValueError(f"duration_s={duration_s}: must not be negative")
        stop = min(start_s + duration_s, self.duration)
        inner = [(t - start_s, n) for t, n in self.points if start_s < t < stop]
        points = [(0.0, self.available(start_s)), *inner, (stop - start_s, self.available(stop))]
        return Trace(f"{self.name}[{start_s:g}+{stop - start_s:g}s]", self.source, _steps(points))

    def compressed(self, factor: float) -> Trace:
        """Time divided by ``factor`` (60: one trace minute lasts one second)."""
        if not factor > 0:
            raise ValueError(f"factor={factor}: must be above 0")
        points = tuple((t / factor, n) for t, n in self.points)
        return Trace(f"{self.name}/{factor:g}", self.source, points)

    def capped(self, nodes: int) -> Trace:
        """At most ``nodes`` available: what a gang of ``nodes`` sees of a larger pool."""
        if nodes < 0:
            raise ValueError(f"nodes={nodes}: must not be negative")
        points = [(t, min(n, nodes)) for t, n in self.points]
        return Trace(f"{self.name}<={nodes}", self.source, _steps(points))

    def changes(self) -> list[tuple[float, int, int]]:
        """``(t, before, after)`` for each change of the value before the end."""
        steps = _steps(self.points)
        return [(t1, n0, n1) for (_, n0), (t1, n1) in itertools.pairwise(steps[:-1]) if n1 != n0]

    def node_seconds(self, cap: int | None = None) -> float:
        """The integral of nodes available (each value capped at ``cap``) over the trace."""
        total = 0.0
        for (t0, n), (t1, _) in itertools.pairwise(self.points):
            total += (t1 - t0) * (n if cap is None else min(n, cap))
        return total

    def rotated(self, offset_s: float) -> Trace:
        """The trace started ``offset_s`` in and wrapped around: the same pool, another phase."""
        if self.duration <= 0:
            return self
        offset = offset_s % self.duration
        head = self.window(offset, self.duration - offset)
        tail = self.window(0, offset)
        points = [*head.points[:-1], *((t + head.duration, n) for t, n in tail.points)]
        return Trace(f"{self.name}@{offset:g}s", self.source, _steps(points))

    @cached_property
    def _times(self) -> list[float]:
        return [t for t, _ in self.points]


def _steps(points: Iterable[tuple[float, int]]) -> tuple[tuple[float, int], ...]:
    """Points with one per time (the last value at a time wins) and no point that repeats the
    value before it, keeping the first and the last (the end)."""
    merged: list[tuple[float, int]] = []
    for t, n in points:
        if merged and merged[-1][0] == t:
            merged[-1] = (float(t), int(n))
        else:
            merged.append((float(t), int(n)))
    out = merged[:1]
    for i, (t, n) in enumerate(merged[1:], start=1):
        if n != out[-1][1] or i == len(merged) - 1:
            out.append((t, n))
    return tuple(out)


def tiled(trace: Trace, pools: int) -> Trace:
    """``pools`` copies of the trace's pool side by side, copy ``i`` rotated by ``i/pools`` of
    the trace: independent pools (zones, instance types) summed."""
    deltas: list[tuple[float, int]] = []
    for i in range(pools):
        copy = trace.rotated(i * trace.duration / pools)
        deltas.append((0.0, copy.points[0][1]))
        deltas.extend((t, after - before) for t, before, after in copy.changes())
    deltas.sort(key=lambda d: d[0])
    points, total = [], 0
    for t, d in deltas:
        total += d
        points.append((t, total))
    points.append((trace.duration, total))
    return Trace(f"{trace.name}x{pools}", trace.source, _steps(points))


def scaled(trace: Trace, nodes: int) -> Trace:
    """The capacity a gang of ``nodes`` sees when its pool behaves like the trace's.

    Up to the trace's own pool (its peak), the trace itself capped at ``nodes`` (a 4-rank gang
    in a 16-node pool loses a node only when fewer than 4 are left). Beyond it, as many
    independent pools as needed (``tiled``), capped at ``nodes``: a 256-node job on 4-node
    traces runs on 64 pools whose losses do not come at the same moments. Scaling the counts
    (x64) was rejected as the default: it makes every loss take a 64th of the job at once,
    which no multi-pool deployment sees; it stays available as ``proportional``.
    """
    if nodes < 1:
        raise ValueError(f"nodes={nodes}: a gang has at least one node")
    pool = trace.peak
    if pool == 0:
        raise ValueError(f"trace {trace.name!r}: no node is ever available")
    if nodes <= pool:
        return trace.capped(nodes)
    return tiled(trace, math.ceil(nodes / pool)).capped(nodes)


def proportional(trace: Trace, nodes: int) -> Trace:
    """The trace's counts times ``nodes / peak``, rounded down: one pool whose losses all come
    at once (the correlated bound to ``scaled``'s independent pools)."""
    pool = trace.peak
    points = [(t, n * nodes // pool) for t, n in trace.points]
    return Trace(f"{trace.name}*{nodes}/{pool}", trace.source, _steps(points))


def busiest_window(trace: Trace, duration_s: float, nodes: int) -> float:
    """Start of the ``duration_s`` window of ``scaled(trace, nodes)`` with the most capacity
    changes (the earliest of equals; 0.0 without changes or when the trace is shorter).

    The window starts a tenth of its length before its first change, so a replay has its job
    running when the first change comes.
    """
    capacity = scaled(trace, nodes)
    if capacity.duration <= duration_s:
        return 0.0
    times = [t for t, _, _ in capacity.changes()]
    lead, latest = duration_s / 10, capacity.duration - duration_s
    best, best_count = 0.0, -1
    for t in times:
        start = min(max(0.0, t - lead), latest)
        lo = bisect.bisect_right(times, start)
        count = bisect.bisect_left(times, start + duration_s) - lo
        if count > best_count:
            best, best_count = start, count
    return best


# -- statistics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceStats:
    """What a trace does to a gang of ``nodes``: capacity changes per hour of the gang and
    node losses per node-hour."""

    name: str
    nodes: int
    hours: float
    changes_per_hour: float
    losses_per_node_hour: float
    mean_available: float
    full_share: float
    zero_share: float


def stats(trace: Trace, nodes: int | None = None) -> TraceStats:
    """Capacity changes per hour of the gang, nodes lost per node-hour available, the mean
    share of the gang available, and the share of time at full size and at none.

    ``nodes`` defaults to the trace's own pool (its peak); other sizes go through ``scaled``.
    """
    size = trace.peak if nodes is None else nodes
    cap = scaled(trace, size)
    hours = cap.duration / 3600
    changes = cap.changes()
    lost = sum(before - after for _, before, after in changes if after < before)
    node_hours = cap.node_seconds() / 3600
    full = zero = 0.0
    for (t0, n), (t1, _) in itertools.pairwise(cap.points):
        full += (t1 - t0) if n >= size else 0.0
        zero += (t1 - t0) if n == 0 else 0.0
    span = cap.duration or 1.0
    return TraceStats(
        name=trace.name,
        nodes=size,
        hours=hours,
        changes_per_hour=len(changes) / hours if hours else 0.0,
        losses_per_node_hour=lost / node_hours if node_hours else 0.0,
        mean_available=cap.node_seconds() / span / size,
        full_share=full / span,
        zero_share=zero / span,
    )


# -- parsing ------------------------------------------------------------------------------------


def parse_skypilot(text: str, path: str, name: str, source: str) -> Trace:
    """A SkyPilot JSON trace: ``{"metadata": {"gap_seconds": G}, "data": [n, ...]}``, sample
    ``i`` holding from ``i*G`` for ``G`` seconds."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None

    def line_of(key: str) -> int:
        at = text.find(f'"{key}"')
        return text.count("\n", 0, at) + 1 if at >= 0 else 1

    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise TraceError(f'{path}:1: no "data" list (a SkyPilot trace is an object with one)')
    gap = (doc.get("metadata") or {}).get("gap_seconds")
    if isinstance(gap, bool) or not isinstance(gap, int | float) or not gap > 0:
        raise TraceError(
            f"{path}:{line_of('gap_seconds')}: metadata.gap_seconds is {gap!r}, "
            "not a number of seconds above 0"
        )
    data = doc["data"]
    for i, n in enumerate(data):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TraceError(
                f"{path}:{line_of('data')}: data[{i}] is {n!r}, not a count of nodes (int >= 0)"
            )
    if not data:
        raise TraceError(f'{path}:{line_of("data")}: "data" is empty')
    points = [(i * gap, n) for i, n in enumerate(data)] + [(len(data) * gap, data[-1])]
    return Trace(name, source, _steps(points))


def parse_bamboo(text: str, path: str, name: str, source: str, unit_s: float = 1.0) -> Trace:
    """A Bamboo CSV trace: ``time,instances`` rows (time in ``unit_s`` seconds; 3600 for the
    files in hours), each change written as two rows at the same time; the last row ends it.
    A header row (any letters) is allowed first."""
    points: list[tuple[float, int]] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or (lineno == 1 and any(c.isalpha() for c in line)):
            continue
        fields = line.split(",")
        try:
            if len(fields) != 2:
                raise ValueError(f"{len(fields)} fields, not 2")
            t, n = float(fields[0]) * unit_s, int(fields[1])
        except ValueError as exc:
            raise TraceError(
                f"{path}:{lineno}: {line!r} is not 'seconds,instances' ({exc})"
            ) from None
        if n < 0 or not math.isfinite(t) or t < 0:
            raise TraceError(f"{path}:{lineno}: {line!r}: time and count must not be negative")
        if points and t < points[-1][0]:
            raise TraceError(f"{path}:{lineno}: time {fields[0]} is before the row above it")
        points.append((t, n))
    if not points:
        raise TraceError(f"{path}:1: no rows")
    if points[0][0] != 0:
        points.insert(0, (0.0, points[0][1]))
    return Trace(name, source, _steps(points))


# -- the known traces ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """Where a named trace comes from and how to read it."""

    repo: str
    commit: str
    path: str
    blob: str
    """The git blob id of the file at ``commit``: the bytes read are checked against it."""
    unit_s: float = 1.0

    @property
    def source(self) -> str:
        return f"{self.repo}@{self.commit[:12]}:{self.path}"


def _sky(kind: str, zone: str, blob: str) -> tuple[str, Known]:
    folder = (
        "preemption/4-node/aws-08-03-2023"
        if kind == "preemption"
        else "availability/16-node/aws-08-27-2023"
    )
    nodes = "4" if kind == "preemption" else "16"
    name = f"skypilot/{kind}-{nodes}node-{zone}-v100"
    return name, Known(SKYPILOT_REPO, SKYPILOT_COMMIT, f"{folder}/{zone}_v100_1.json", blob)


def _bamboo(short: str, file: str, blob: str, unit_s: float = 1.0) -> tuple[str, Known]:
    return f"bamboo/{short}", Known(BAMBOO_REPO, BAMBOO_COMMIT, f"doc/data/{file}", blob, unit_s)


KNOWN: dict[str, Known] = dict(
    [
        _sky("preemption", "us-east-1f", "4c3176a8367acc412208bc1591f753a2438bdf91"),
        _sky("preemption", "us-east-2a", "77934e9013dd1716d35af89b6e6a5d502ed7b91e"),
        _sky("preemption", "us-west-2c", "3ecc7939a031497f3c8971401347197e4f1a35bb"),
        _sky("availability", "us-east-2b", "c5a9098f07acdfcbd57dd0550313195297333658"),
        _sky("availability", "us-west-2a", "919451ad076299f2afe71664df1a24ce8f7a863a"),
        _sky("availability", "us-west-2c", "1fae202fc59352828bf6060c953e4879c1dc1609"),
        _bamboo(
            "g4dn-us-east-1c-2020-11-20",
            "aws-spot-instances-g4dn-xlarge-us-east-1c-2020-11-20-1930-to-2020-11-21-2200.csv",
            "e608527d59a809e0bc279e6435a81775cf03e059",
        ),
        _bamboo(
            "g4dn-us-east-1d-2020-11-23",
            "aws-spot-instances-g4dn-xlarge-us-east-1d-2020-11-23-1730-to-2020-11-24-1530.csv",
            "367f76e9bebf35cbd4f204ea6c15d0d1bace75d7",
        ),
        _bamboo(
            "p2-2020-11-20-to-2020-11-23",
            "aws-spot-instances-p2-xlarge-2020-11-20-to-2020-11-23.csv",
            "1cf6c88e597e39b3ca588aaa969781b052b207dc",
            unit_s=3600.0,
        ),
    ]
)


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes (``git hash-object``): how a copy is matched to the
    commit it is cited from."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def cache_dir() -> Path:
    """Where ``fetch`` puts the SkyPilot files: the user's cache, keyed by commit."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "resumable-training" / "spot-traces" / f"{SKYPILOT_REPO}@{SKYPILOT_COMMIT}"


def local_path(name: str) -> Path:
    """Where the file of trace ``name`` is read from on this machine (it may not exist)."""
    known = _known(name)
    if known.repo == BAMBOO_REPO:
        return TRACES_DIR / "bamboo" / Path(known.path).name
    checkout = os.environ.get(SKYPILOT_ENV)
    return (Path(checkout) if checkout else cache_dir()) / known.path


def _known(name: str) -> Known:
    try:
        return KNOWN[name]
    except KeyError:
        raise KeyError(f"no trace {name!r}; known: {', '.join(sorted(KNOWN))}") from None


def known_traces() -> list[str]:
    """Every trace name this module knows, whether or not its file is on this machine."""
    return sorted(KNOWN)


def available_traces() -> list[str]:
    """The traces ``load`` can read here: the shipped Bamboo ones always, the SkyPilot ones
    once fetched (``python benchmarks/spot_traces.py fetch``) or with ``RTJ_SKYPILOT_TRACES``."""
    return [name for name in known_traces() if local_path(name).is_file()]


def load(name: str) -> Trace:
    """The trace ``name`` (see ``available_traces``), checked against its cited git blob."""
    known = _known(name)
    path = local_path(name)
    if not path.is_file():
        raise TraceMissingError(
            f"trace {name!r}: {path} does not exist. Run `python benchmarks/spot_traces.py "
            f"fetch` (downloads {known.repo} at {known.commit[:12]}), or set {SKYPILOT_ENV} to "
            "a checkout of that repository"
        )
    data = path.read_bytes()
    if git_blob_id(data) != known.blob:
        raise TraceError(
            f"{path}:1: not the file cited ({known.source}, blob {known.blob[:12]}); "
            "check out that commit or fetch again"
        )
    text = data.decode()
    if known.repo == SKYPILOT_REPO:
        return parse_skypilot(text, str(path), name, known.source)
    return parse_bamboo(text, str(path), name, known.source, known.unit_s)


def fetch(names: Sequence[str] | None = None) -> list[Path]:
    """Download the SkyPilot files at the pinned commit into ``cache_dir()``; each is checked
    against its blob id before it is written. Files already there are kept."""
    done = []
    for name in names or [n for n in known_traces() if KNOWN[n].repo == SKYPILOT_REPO]:
        known = _known(name)
        target = cache_dir() / known.path
        if not target.is_file():
            url = f"https://raw.githubusercontent.com/{known.repo}/{known.commit}/{known.path}"
            with urllib.request.urlopen(url, timeout=60) as response:
                data = response.read()
            if git_blob_id(data) != known.blob:
                raise TraceError(f"{url}:1: the bytes downloaded are not blob {known.blob}")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.with_suffix(".part").write_bytes(data)
            target.with_suffix(".part").replace(target)
        done.append(target)
    return done


def _print_stats(nodes: Sequence[int | None]) -> None:
    print(
        f"{'trace':<46} {'nodes':>5} {'hours':>6} {'chg/h':>6} {'loss/node-h':>11} "
        f"{'mean':>5} {'full':>5} {'none':>5}"
    )
    for name in available_traces():
        trace = load(name)
        for size in nodes:
            s = stats(trace, size)
            print(
                f"{name:<46} {s.nodes:>5} {s.hours:>6.1f} {s.changes_per_hour:>6.2f} "
                f"{s.losses_per_node_hour:>11.3f} {s.mean_available:>5.2f} "
                f"{s.full_share:>5.2f} {s.zero_share:>5.2f}"
            )
    missing = sorted(set(known_traces()) - set(available_traces()))
    if missing:
        print(f"not here ({len(missing)}; `fetch` gets them): {', '.join(missing)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the known traces and whether each is here")
    st = sub.add_parser("stats", help="changes and losses of each trace here")
    st.add_argument("--nodes", type=int, nargs="+", help="gang sizes (default: each pool's own)")
    sub.add_parser("fetch", help="download the SkyPilot files into the user's cache")
    args = parser.parse_args(argv)
    if args.command == "list":
        here = set(available_traces())
        for name in known_traces():
            print(f"{name:<46} {'here' if name in here else 'missing'}  {KNOWN[name].source}")
    elif args.command == "stats":
        _print_stats(args.nodes or [None])
    else:
        for path in fetch():
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
