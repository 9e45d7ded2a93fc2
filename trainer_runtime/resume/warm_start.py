"""A relaunched rank fetches its checkpoint while its gang forms.

A rank of a new attempt spends its first seconds importing torch and waiting in
``init_process_group`` for the slowest pod of its gang, and only then, in ``resume()``, starts
downloading the checkpoint it resumes from: the fetch (minutes for a multi-GB state on a GPU
cluster) comes after the wait instead of during it. So when ``trainer_runtime`` is imported in a
pod whose operator named a specific committed checkpoint (``RTJ_RESUME_FROM`` under
``$RTJ_CHECKPOINT_DIR/$RTJ_RUN_NAME`` in an object store), a background thread downloads that
checkpoint into the run's local staging folder at once, with the same verified, manifest-last
download ``resume()`` uses. ``CheckpointManager`` waits for it before it touches the run folder,
and ``resume()`` then finds the checkpoint on the local disk (files that verify are not fetched
again), still checks the store for a newer one and verifies every file it loads: the prefetch
changes when bytes arrive, never what is loaded.

The named checkpoint is where resume starts looking, not a pin: ``resume()`` goes on to a newer
committed one the store holds. One can land after the operator named it: when a node is lost
without notice, a survivor saves the last finished step from memory while the replacement pod
is created (``save/survivor.py``). So the prefetch first lists the run's committed checkpoints
and, when the newest (quarantined ones left out) is further on than the named one, fetches that
instead: otherwise the new rank would download the older state, load it, find the newer one and
download and load again. Listing costs a few small requests before the download starts.

A worker the in-pod agent starts for a new membership (``RTJ_MEMBERSHIP_CHANGED``: a restart
in place, a standby pod's start) prefetches too, but first waits until node rank 0's agent says
in the new rendezvous store that the old gang's saves are over (``rendezvous_store.SETTLED_KEY``):
before that a listing finds only the checkpoint before the survivor's save or the switch's save,
whose download would be wasted. Then it fetches the named checkpoint, a newer one, or with none
named (a grow's switch) the run's newest. A download still waiting when ``CheckpointManager``
asks for it (the gang formed without the word: no store of the agent's) is given up, and
``resume()`` fetches. The operator marks the new pods that join kept ones the same way; their
agent, which has not imported torch when it imports the runtime, fetches without the wait (see
``start_from_environment``), and their workers fetch only what is newer than that.

One process per pod fetches (local rank 0; the pod's ranks share its disk). It records what it
fetched for the pod's other ranks too (``was_prefetched``), so that every rank's ``resumed``
event names the same source: ``remote``, as the bytes came from the store. A process forked from
the fetching one (the in-pod agent's workers) inherits the record in memory; torchrun's other
local ranks read a marker the fetcher writes under the temporary folder (a container's own),
keyed by the run folder, the host name (the pod's) and the parent process (torchrun's agent,
the ranks' common parent). A prefetch that fails (the store unreachable, the checkpoint gone)
is logged and left to ``resume()``, which reports it as it always did. ``RTJ_PREFETCH=0`` turns
it off.
(Rejected: fetching in ``CheckpointManager``'s constructor: it runs after
``init_process_group``, so the wait for the gang would not hide the fetch.)
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import envvars

if TYPE_CHECKING:
    from ..objectstore.store import S3Store

log = logging.getLogger(__name__)
OFF = ("0", "false", "no", "off")
SETTLE_POLL_S = 0.05
"""How often a worker restarted in place asks the store whether the old gang's saves are over."""


@dataclass(frozen=True)
class SettleWait:
    """Where a worker restarted in place learns that the old gang's saves are over: the new
    rendezvous store, once it says ``SETTLED_KEY`` for this membership ``epoch``."""

    addr: str
    port: int
    epoch: int


@dataclass(frozen=True)
class PrefetchPlan:
    """What to fetch (a committed checkpoint's URI, or a newer one of its run that is not
    quarantined; empty: the run's newest) and where to (the run's staging folder); ``settle``:
    first wait for the old gang's saves to end."""

    checkpoint_uri: str
    local_run_dir: Path
    rank: int
    run_uri: str = ""
    quarantined: frozenset[str] = frozenset()
    settle: SettleWait | None = None


def settle_from_environment(environ: Mapping[str, str]) -> SettleWait | None:
    """For a worker the agent started for a new membership (``RTJ_MEMBERSHIP_CHANGED``), where
    to wait for the old gang's saves to end; None for any other worker."""
    get = lambda name: environ.get(name, "").strip()  # noqa: E731
    addr, port, epoch = (
        get(envvars.MASTER_ADDR),
        get(envvars.MASTER_PORT),
        get(envvars.MEMBERSHIP_EPOCH),
    )
    if get(envvars.MEMBERSHIP_CHANGED) != "1" or not (addr and port.isdigit() and epoch.isdigit()):
        return None
    return SettleWait(addr, int(port), int(epoch))


def plan_from_environment(environ: Mapping[str, str]) -> PrefetchPlan | None:
    """The prefetch a managed pod's environment asks for, or None."""
    get = lambda name: environ.get(name, "").strip()  # noqa: E731
    if get(envvars.PREFETCH).lower() in OFF or get(envvars.LOCAL_RANK) not in ("", "0"):
        return None
    if get(envvars.PEER_STATE) == "1":
        return None  # the running gang switches in process and sends the state (switch.py)
    resume, root, run = get(envvars.RESUME_FROM), get(envvars.CHECKPOINT_DIR), get(envvars.RUN_NAME)
    if not (root.startswith("s3://") and run):
        return None
    run_uri = f"{root.rstrip('/')}/{run}"
    settle = settle_from_environment(environ)
    if settle is not None and resume.rstrip("/") in ("", run_uri):
        resume = ""  # the run's newest, once the old gang's saves are over
    else:
        parent, _, name = resume.rstrip("/").rpartition("/")
        if not resume.startswith("s3://") or parent != run_uri or not name:
            return None  # the run's root (resume() resolves the newest) or another run's folder
    from ..run.config import _staging_dir, quarantined_names  # noqa: PLC0415 - torch-free

    try:
        local_run_dir = _staging_dir(run_uri, None, environ)
    except ValueError:  # RTJ_LOCAL_CHECKPOINT_DIR is itself s3://: the manager says so
        return None
    rank = get(envvars.RANK)
    return PrefetchPlan(
        resume,
        local_run_dir,
        int(rank) if rank.isdigit() else 0,
        run_uri,
        quarantined_names(get(envvars.QUARANTINED)),
        settle,
    )


def newest_target(store: S3Store, plan: PrefetchPlan) -> str | None:
    """The checkpoint to fetch: the named one, or the newest committed one of its run when that
    is further on (by training progress, as ``resume()`` orders them); with none named, the
    newest, or None when the run has none."""
    from ..objectstore.resolver import list_remote_checkpoints  # noqa: PLC0415
    from ..objectstore.uri import parse_s3_uri  # noqa: PLC0415
    from ..run_folder.layout import progress_key  # noqa: PLC0415

    if not plan.checkpoint_uri:
        committed = list_remote_checkpoints(store, plan.run_uri, exclude=plan.quarantined)
        return str(committed[0].uri) if committed else None
    named = parse_s3_uri(plan.checkpoint_uri).name
    if not plan.run_uri or named in plan.quarantined:
        return plan.checkpoint_uri
    committed = list_remote_checkpoints(store, plan.run_uri, exclude=plan.quarantined)
    named_manifest = next((c.manifest for c in committed if c.name == named), None)
    if not committed or named_manifest is None:
        return plan.checkpoint_uri  # not committed (yet): the download says why
    newest = committed[0]
    if progress_key(newest.manifest) > progress_key(named_manifest):
        log.info("prefetch: %s is newer than the named %s; fetching it", newest.name, named)
        return str(newest.uri)
    return plan.checkpoint_uri


class CheckpointPrefetch:
    """One background download of a committed checkpoint into the local run folder."""

    def __init__(self, plan: PrefetchPlan, have: Path | None = None) -> None:
        """``have``: a checkpoint folder this process already fetched (the agent's, inherited by
        a forked worker): not fetched again when it is still the one to resume from."""
        self.plan = plan
        self.have = have
        self.fetched: Path | None = None
        self.error: BaseException | None = None
        self.seconds: float | None = None
        self._given_up = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtj-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from .. import events  # noqa: PLC0415
        from ..objectstore.resolver import download_checkpoint  # noqa: PLC0415
        from ..objectstore.store import S3Store  # noqa: PLC0415

        plan = self.plan
        if plan.settle is not None and not await_settled(plan.settle, self._given_up):
            log.info("prefetch: given up before the old gang's saves were said over")
            return
        began = time.monotonic()
        uri: str | None = plan.checkpoint_uri
        try:
            store = S3Store()
            uri = newest_target(store, plan)
            if uri is None:
                return  # nothing committed yet: resume() starts fresh or finds one itself
            if self._have(uri):
                self.fetched = self.have  # resume() verifies what it loads
                return
            path = download_checkpoint(store, uri, plan.local_run_dir)
        except Exception as exc:  # resume() meets the same problem and reports it
            self.error = exc
            log.warning("prefetch of %s failed (%s); resume() fetches", uri, exc)
            return
        self.seconds = time.monotonic() - began
        self.fetched = path
        with contextlib.suppress(OSError):  # without it the other local ranks say "local"
            marker = _marker(plan.local_run_dir, path.name)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(uri + "\n")
        events.fetched(
            rank=plan.rank,
            checkpoint=path.name,
            uri=uri,
            sent=folder_bytes(path),
            seconds=self.seconds,
            prefetch=True,
        )

    def _have(self, uri: str) -> bool:
        """Whether ``uri`` is the checkpoint this process fetched before, still on the disk."""
        from ..objectstore.uri import parse_s3_uri  # noqa: PLC0415

        folder = self.plan.local_run_dir / parse_s3_uri(uri).name
        return self.have == folder and (folder / "manifest.json").is_file()

    def wait(self) -> None:
        """Wait for the download; one still waiting for the old gang's saves is given up (the
        caller's gang has formed, so they are over: ``resume()`` fetches what it needs)."""
        self._given_up.set()
        self._thread.join()


def await_settled(wait: SettleWait, given_up: threading.Event) -> bool:
    """Wait until the store at ``wait.addr:wait.port`` says the old gang's saves are over for
    ``wait.epoch`` (``rendezvous_store.SETTLED_KEY``); False when ``given_up`` is set first.
    A store that is not up yet, or goes (node rank 0 swapping its stores), is asked again."""
    from ..agent.rendezvous_store import (  # noqa: PLC0415 - only this wait needs it
        SETTLED_KEY,
        StoreReader,
        StoreUnreachableError,
    )

    reader = StoreReader(wait.addr, wait.port)
    began = time.monotonic()
    while not given_up.is_set():
        try:
            said = reader.read(SETTLED_KEY, connect_timeout_s=0.5)
        except StoreUnreachableError:  # not up yet, or gone: ask again
            given_up.wait(SETTLE_POLL_S * 4)
            continue
        if said == str(wait.epoch).encode():
            log.info(
                "prefetch: the old gang's saves were over after %.2f s", time.monotonic() - began
            )
            return True
        given_up.wait(SETTLE_POLL_S)
    return False


def folder_bytes(path: Path) -> int:
    """The size of the files of a fetched checkpoint folder (what the load reads)."""
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


_prefetch: CheckpointPrefetch | None = None
_lock = threading.Lock()


def start_from_environment(have: Path | None = None) -> CheckpointPrefetch | None:
    """Start the prefetch the environment asks for, once per process.

    The wait for the old gang's saves asks a TCPStore, which needs torch. Its import on the
    download thread beside the script's own on the main thread brought the process down
    (std::terminate in torch's import, seen in the agent), and importing torch here first would
    keep the download from running beside that import. So a process that has not imported torch
    yet (the agent at its start, a script that imports the runtime first) fetches without the
    wait; the workers the agent forks later, torch imported, wait."""
    global _prefetch  # noqa: PLW0603 - one prefetch per process
    with _lock:
        if _prefetch is None:
            plan = plan_from_environment(os.environ)
            if plan is not None and plan.settle is not None and not _torch_imported():
                plan = replace(plan, settle=None)
            if plan is not None:
                _prefetch = CheckpointPrefetch(plan, have)
        return _prefetch


def _torch_imported() -> bool:
    """Whether torch is imported in this process, and not being imported right now."""
    torch = sys.modules.get("torch")
    spec = getattr(torch, "__spec__", None)
    return torch is not None and not getattr(spec, "_initializing", False)


def start_in_forked_worker() -> CheckpointPrefetch | None:
    """``start_from_environment`` for a worker the agent forked, with the worker's environment
    in place. The worker inherits the agent's prefetch, which is the one it needs at the agent's
    first start; a worker for a new membership (``RTJ_MEMBERSHIP_CHANGED``) starts its own,
    which waits for the old gang's saves: the agent's fetched the checkpoint of the membership it
    started with, before those saves were over. When the newest is still the one the agent
    fetched, it is not fetched again."""
    global _prefetch
    if os.environ.get(envvars.MEMBERSHIP_CHANGED, "").strip() != "1":
        return start_from_environment()
    with _lock:
        inherited, _prefetch = _prefetch, None
    return start_from_environment(inherited.fetched if inherited is not None else None)


def was_prefetched(run_dir: Path, name: str) -> bool:
    """Whether this pod's prefetch put checkpoint ``name`` into ``run_dir``: a resume from it is
    a resume from the store (its ``resumed`` event says ``remote``)."""
    done = _prefetch
    if done is not None and done.fetched is not None:
        return done.fetched == Path(run_dir) / name
    return _marker(run_dir, name).is_file()


def _marker(run_dir: Path, name: str) -> Path:
    """The fetching process's record of ``name`` for the pod's other local ranks."""
    folder = hashlib.sha256(str(Path(run_dir).absolute()).encode()).hexdigest()[:16]
    pod = f"{folder}-{socket.gethostname()}-{os.getppid()}"
    return Path(tempfile.gettempdir()) / "rtj-prefetched" / pod / name


def wait_for_prefetch() -> None:
    """Block until a prefetch started by this process is done (the run folder is ours then)."""
    with _lock:
        running = _prefetch
    if running is not None:
        running.wait()
