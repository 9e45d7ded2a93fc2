"""The real-node story's plan check (tools/stories/realnodes.py), without a cluster."""

from __future__ import annotations

import pytest

from tools.stories.realnodes import check_interruptions


@pytest.mark.parametrize("good", [["notice"], ["lost"], ["notice", "lost"], ["notice", "notice"]])
def test_a_possible_story_is_accepted(good: list[str]) -> None:
    check_interruptions(good)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (["lost", "notice"], "must be the last"),
        (["notice", "lost", "lost"], "must be the last"),
        (["reclaim"], "expected each of"),
    ],
)
def test_an_impossible_story_is_refused_before_anything_runs(bad: list[str], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        check_interruptions(bad)
