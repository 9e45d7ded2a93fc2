"""What one pass reads besides the job's labelled pods (act/job_reads.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from rtj_operator.act.job_reads import JobReader
from rtj_operator.act.watch_cache import WatchCache

from .fake_api import FakeApi
from .fakes import make_job, make_pod


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
