"""What one pass reads besides the job's labelled pods (act/job_reads.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from rtj_operator.act.job_reads import JobReader
from rtj_operator.act.watch_cache import WatchCache
from rtj_operator.api.envvars import PEER_LOST_ANNOTATION
from trainer_runtime.pod.peer_loss import payload

from .fake_api import FakeApi
from .fakes import make_job, make_node, make_pod


class CountingApi(FakeApi):
    def __init__(self) -> None:
        super().__init__()
        self.read_paths: list[str] = []

    async def get_object(self, path: str) -> dict[str, Any] | None:
        self.read_paths.append(path)
        return await super().get_object(path)


def test_the_names_looked_for_unlabelled_pods_are_the_ranks_still_to_be_created():
    """While the attempt's gang is created, its pod names are read one by one for pods made by
    hand. After survivors stay, the kept ranks' pods exist under their own names: only the new
    ranks' names are read, not names that will never be created."""
    api = CountingApi()
    kept = make_pod(attempt=0, rank=0)
    job = make_job(
        status={"attempt": 1, "gangSize": 2, "keptPods": [kept["metadata"]["name"]]},
    )
    reader = JobReader(api, discovery=None, watched=WatchCache())  # type: ignore[arg-type]
    assert asyncio.run(reader.unlabelled_holders(job, [kept])) == []
    assert [p.rsplit("/", 1)[-1] for p in api.read_paths] == ["train-a1-r1"]


def lease(renewed: str) -> dict[str, Any]:
    return {"spec": {"renewTime": renewed, "leaseDurationSeconds": 40}}


def test_node_leases_are_read_only_while_a_rank_of_the_gang_reports_a_lost_peer():
    """No report of the current gang: no Lease is read (a Lease is never watched). With one, the
    Leases of the gang's nodes are, and a renewal read again keeps the time it was first read,
    so the operator's own clock bounds how long it saw no renewal."""
    api = FakeApi()
    api.nodes = {n: make_node(n) for n in ("node-0", "node-1")}
    api.leases = {n: lease("2026-12-07T10:00:00.000000Z") for n in ("node-0", "node-1")}
    job = make_job(status={"attempt": 1, "gangSize": 2})
    reader = JobReader(api, discovery=None, watched=WatchCache())  # type: ignore[arg-type]
    pods = [make_pod(attempt=1, rank=r, node=f"node-{r}") for r in (0, 1)]
    views = asyncio.run(reader.node_views(job, pods))
    assert "get_node_lease" not in api.calls
    assert views["node-0"].lease_renewed is None

    stale = make_pod(attempt=1, rank=0, annotations={PEER_LOST_ANNOTATION: payload(0)})
    asyncio.run(reader.node_views(job, [stale, pods[1]]))
    assert "get_node_lease" not in api.calls, "a report of an older gang reads nothing"

    reported = make_pod(attempt=1, rank=0, annotations={PEER_LOST_ANNOTATION: payload(1)})
    first = asyncio.run(reader.node_views(job, [reported, pods[1]]))
    assert api.calls.count("get_node_lease") == 2
    assert first["node-1"].lease_seconds == 40 and first["node-1"].lease_seen is not None
    api.leases["node-0"] = lease("2026-12-07T10:00:09.000000Z")  # node-0's kubelet renewed
    again = asyncio.run(reader.node_views(job, [reported, pods[1]]))
    assert again["node-1"].lease_seen == first["node-1"].lease_seen
    assert again["node-0"].lease_seen > first["node-0"].lease_seen
