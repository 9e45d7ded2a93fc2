"""The elastic story's reading of the ranks' records (tools/stories/elastic.py), without a cluster.

The rule that matters: a rank that sat out a shrunk attempt never saw that attempt's resume, so
its steps past that resume point must still be rolled back (decided by attempt over all ranks).
"""

from __future__ import annotations

import json
from pathlib import Path

from tools.stories.elastic import read_ledger, read_transitions


def write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def step(sample: int, ids: list[int]) -> dict:
    return {"batch": sample // 4, "sample": sample, "ids": ids}


def test_steps_a_later_resume_rolled_back_are_dropped_for_ranks_that_sat_it_out(tmp_path):
    # 2 ranks at 2 samples per step; attempt 1 runs rank 0 alone from sample 4 (steps 6 and 8 of
    # attempt 0 are lost); attempt 2 brings rank 1 back from sample 8.
    write(
        tmp_path / "run.trace.rank0",
        [
            {"resumed_at_sample": 0, "world": 2, "attempt": 0},
            step(2, [0]),
            step(4, [1]),
            step(6, [9]),
            {"resumed_at_sample": 4, "world": 1, "attempt": 1},
            step(6, [4, 5]),
            step(8, [6, 7]),
            {"resumed_at_sample": 8, "world": 2, "attempt": 2},
            step(10, [8]),
        ],
    )
    write(
        tmp_path / "run.trace.rank1",
        [
            {"resumed_at_sample": 0, "world": 2, "attempt": 0},
            step(2, [2]),
            step(4, [3]),
            step(6, [4]),  # rolled back by attempt 1, which rank 1 never saw
            {"resumed_at_sample": 8, "world": 2, "attempt": 2},
            step(10, [9]),
        ],
    )
    ledger = read_ledger(tmp_path, "run", 2)
    assert ledger.worlds == {0: 2, 1: 1, 2: 2}
    counts = ledger.consumption(dataset_size=10)
    assert sorted(i for _, i in counts) == list(range(10))
    assert set(counts.values()) == {1}
    assert set(ledger.samples_per_step().values()) == {2}


def test_a_resume_is_matched_with_the_earlier_save_of_the_same_checkpoint(tmp_path):
    write(
        tmp_path / "run.digests.rank0",
        [
            {
                "event": "resume",
                "source": "none",
                "path": None,
                "step": 0,
                "world": 2,
                "digest": "d0",
                "attempt": 0,
            },
            {
                "event": "save",
                "checkpoint": "ep0-ba4",
                "step": 4,
                "world": 2,
                "digest": "d4",
                "attempt": 0,
            },
            {
                "event": "resume",
                "source": "hint",
                "path": "/x/ep0-ba4",
                "step": 4,
                "world": 1,
                "digest": "d4",
                "attempt": 1,
            },
            {
                "event": "save",
                "checkpoint": "ep0-ba6",
                "step": 6,
                "world": 1,
                "digest": "d6",
                "attempt": 1,
            },
        ],
    )
    write(
        tmp_path / "run.digests.rank1",
        [
            {
                "event": "resume",
                "source": "hint",
                "path": "/y/ep0-ba6/",
                "step": 6,
                "world": 2,
                "digest": "other",
                "attempt": 2,
            },
        ],
    )
    first, second = read_transitions(tmp_path, "run", 2)
    assert (first.attempt, first.rank, first.saved["digest"]) == (1, 0, "d4")
    assert first.loaded_digest == first.saved["digest"] and first.newest_saved_step == 4
    assert (second.attempt, second.rank, second.saved["step"]) == (2, 1, 6)
    assert second.loaded_digest != second.saved["digest"] and second.newest_saved_step == 6
