"""The survivors' save in shares: every kept pod writes a part of the last finished step.

After a loss without notice one survivor saves the last finished step from its memory
(``save/survivor.py``). One process writing a whole replica is what that save costs at scale: a
model whose weights and optimizer state take 112 GB is written and uploaded by one process at
its own bandwidth, for about two minutes at 1 GB/s, while the whole new gang waits. Every kept
pod holds the same replica, so the operator names them all (``savers`` in the membership: the
kept pods, which take the new gang's first node ranks; a spare holds nothing), and when the
replica is large enough the local rank 0 worker of each of them writes a share:

1. **the group**: each saver waits until the store at the new gang's rendezvous says the new
   epoch (node rank 0's agent serves it from the moment it reads the membership; until then an
   older gang's store may answer there) and says it came. The savers decide once, in the store,
   whether they save together: yes when the last one came before any one's wait ended, else no,
   so a saver that comes late never tries to connect to one that left. Then each leaves its
   broken process group and forms a gloo group of its own with the others, over that store under
   a key prefix of its own (``GROUP_PREFIX/<epoch>``), so it never meets the new gang's keys.
2. **the agreement**: every saver says the step it holds. Only if all hold the same one, and it is
   not the newest commit already, do they write it together. Otherwise node rank 0 saves alone, as
   it does when the group does not form within ``RTJ_REJOIN_SECONDS`` (a saver that learns of the
   membership late or not at all, a store that does not say its epoch).
3. **the save**: one checkpoint at world size ``savers``, through the ordinary commit. DCP spreads
   the replicated tensors over the savers (each written once, balanced), each saver writes its own
   small state under its own rank (the new gang's first ranks restore those exactly), uploads its
   own files when the run has a store, and node rank 0 commits once every share is there.

A small replica is saved by node rank 0 alone: below ``RTJ_SURVIVOR_SPLIT_MIB`` (1024 MiB by
default) forming the group costs more than the bytes it shares out. Every saver decides from the
size of its own live state, which is the same on every rank of a data-parallel gang.

Like any checkpoint of the run, a split one is whole only in a shared folder or in the store: in
node-local folders without a store each node holds its own share.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from .. import envvars
from ..agent.rendezvous_store import EPOCH_KEY, StoreReader, StoreUnreachableError
from ..pod.membership import Membership
from ..run import arguments
from ..run.dist import Coordinator

if TYPE_CHECKING:
    from ..run.context import RunContext

log = logging.getLogger("trainer_runtime")

DEFAULT_SPLIT_MIB = 1024
"""``RTJ_SURVIVOR_SPLIT_MIB``' default: from this much replicated state the save is split."""
GROUP_PREFIX = "rtj/survivor-save"
"""The savers' keys in the new gang's rendezvous store: under this prefix and the epoch."""
LEAVE_WAIT_S = 10.0
"""How long leaving the broken process group may take; a backend that hangs there (a collective
that never ends) leaves node rank 0 to save alone."""
STORE_POLL_S = 0.05
EPOCH_GRACE_S = 2.0
"""How long a store that answers without an epoch is looked at again before it is taken for
one a worker hosts (node rank 0's agent writes the epoch right after its store listens)."""
ARRIVED_KEY, DECISION_KEY = "arrived", "decision"
"""How many savers came, and whether they save together (``GO``) or not (``OFF``)."""
GO, OFF = "go", "off"


def split_from_bytes(environ: Mapping[str, str]) -> int:
    """``RTJ_SURVIVOR_SPLIT_MIB`` in bytes."""
    mib = arguments.environment_integer(
        envvars.SURVIVOR_SPLIT_MIB,
        environ,
        DEFAULT_SPLIT_MIB,
        "a number of MiB >= 0",
        lambda n: n >= 0,
    )
    return mib << 20


def replica_bytes(ctx: RunContext) -> int:
    """The bytes of this rank's live weights, buffers and optimizer state."""
    comps = ctx.components
    tensors: list[Any] = []
    if comps.model is not None:
        tensors += [*comps.model.parameters(), *comps.model.buffers()]
    for opt in comps.optimizers.values():
        for state in getattr(opt, "state", {}).values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def splits(ctx: RunContext, new: Membership, split_from: int) -> bool:
    """Whether the save for ``new`` is made in shares by its ``savers``: more than one, and a
    replica of ``split_from`` bytes or more."""
    return new.savers > 1 and replica_bytes(ctx) >= split_from


def form(new: Membership, wait_s: float) -> Coordinator | None:
    """This saver's place in the savers' group of ``new`` (rank = its node rank), or None when
    the group did not form within ``wait_s`` (said in the log)."""
    deadline = time.monotonic() + wait_s
    store, current = _current_store(new, deadline)
    if store is None:
        return None
    keys = dist.PrefixStore(f"{GROUP_PREFIX}/{new.epoch}", store)
    try:
        if not current:
            keys.compare_set(DECISION_KEY, "", OFF)  # the others need not wait for this one
            return None
        came = _all_came(keys, new.savers, deadline)
    except (RuntimeError, ValueError) as exc:  # the store went away (node rank 0's pod)
        log.warning("the savers' store failed: %s", exc)
        return None
    if not came:
        log.warning(
            "the %d savers do not save together: not all of them came within %.0f s "
            "(RTJ_REJOIN_SECONDS; %.1f s waited here)",
            new.savers,
            wait_s,
            wait_s - (deadline - time.monotonic()),
        )
        return None
    if not _leave_broken_group():
        log.warning("the broken process group was not left within %.0f s", LEAVE_WAIT_S)
        return None
    try:
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore("group", keys),
            rank=new.node_rank,
            world_size=new.savers,
            timeout=datetime.timedelta(seconds=max(1.0, deadline - time.monotonic())),
        )
        return Coordinator()
    except Exception as exc:  # a saver gone since it came: node rank 0 saves alone
        log.warning(
            "the %d savers' group did not form (waited %.1f s of %.0f s): %s",
            new.savers,
            wait_s - (deadline - time.monotonic()),
            wait_s,
            " ".join(str(exc).split())[:200],
        )
        return None


def _all_came(keys: dist.Store, savers: int, deadline: float) -> bool:
    """Whether every saver came before any gave up: one decision for all of them. The last to
    come decides ``go``; one whose wait ends first decides ``off``. Either is written once
    (compare-and-set), so a saver that comes late reads ``off`` and never tries to connect to
    the ones that left (a connection to a saver gone can wait on the transport's own timeout,
    far beyond ``deadline``)."""
    if keys.add(ARRIVED_KEY, 1) >= savers:
        keys.compare_set(DECISION_KEY, "", GO)
    while not keys.check([DECISION_KEY]) and time.monotonic() < deadline:
        time.sleep(STORE_POLL_S)
    return keys.compare_set(DECISION_KEY, "", OFF) == GO.encode()


def agree(coord: Coordinator, key: Any) -> bool:
    """Whether every saver holds the step ``key`` names (None: this one holds none to save); a
    saver gone since the group formed is no agreement either."""
    try:
        keys = coord.all_gather(key)
    except (RuntimeError, ValueError) as exc:  # torch.distributed's errors are RuntimeErrors
        log.warning("the savers could not agree on the step (%s); node rank 0 saves alone", exc)
        return False
    if key is not None and all(k == key for k in keys):
        return True
    if coord.rank == 0:
        log.warning("the savers hold different steps (%s); node rank 0 saves alone", keys)
    return False


def _current_store(new: Membership, deadline: float) -> tuple[dist.TCPStore | None, bool]:
    """A client of the store at ``new``'s rendezvous, and whether it says ``new``'s epoch (or a
    newer one). A store that answers without saying any is looked at again for
    ``EPOCH_GRACE_S`` (node rank 0's agent starts its store, then writes the epoch) and then
    taken for one a worker of the new gang hosts, which goes away with that worker. (None,
    False): nothing answered by the deadline."""
    reader = StoreReader(new.master_addr, new.master_port)
    silent_since: float | None = None
    while True:
        now = time.monotonic()
        try:
            said = reader.read(EPOCH_KEY, connect_timeout_s=max(1.0, min(deadline - now, 5.0)))
        except StoreUnreachableError:  # nothing listening there yet
            said = b""
        if said and int(said) >= new.epoch:
            return reader.client, True
        if said is None:
            silent_since = now if silent_since is None else silent_since
            if now - silent_since >= EPOCH_GRACE_S:
                log.warning("the store at the new rendezvous says no epoch: no shared save")
                return reader.client, False
        if now >= deadline:
            log.warning("the store of epoch %d did not answer in time: no shared save", new.epoch)
            return reader.client, False
        time.sleep(STORE_POLL_S)


def _leave_broken_group() -> bool:
    """Leave the old gang's process group (broken: a rank is gone), on a thread of its own with a
    bound; whether it was left."""
    if not dist.is_initialized():
        return True
    thread = threading.Thread(target=dist.destroy_process_group, name="rtj-leave", daemon=True)
    thread.start()
    thread.join(LEAVE_WAIT_S)
    return not thread.is_alive() and not dist.is_initialized()
