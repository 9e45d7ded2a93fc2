"""``fallback.first_valid``: the one newest-valid walk (resume, load, resolver, export)."""

from __future__ import annotations

import pytest

from trainer_runtime.run_folder.fallback import first_valid


def test_chooses_the_first_candidate_that_holds_up_and_says_why_newer_ones_did_not():
    reasons = {"ep0-ba30": "rank1.pt fails its checksum", "ep0-ba20": "not present on rank 1"}
    rejected: list[tuple[str, str]] = []
    walk = first_valid(
        ["ep0-ba30", "ep0-ba20", "ep0-ba10", "ep0-ba5"],
        reasons.get,
        on_reject=lambda name, why: rejected.append((name, why)),
    )
    assert walk.chosen == "ep0-ba10"
    assert walk.passed_over == [
        ("ep0-ba30", "rank1.pt fails its checksum"),
        ("ep0-ba20", "not present on rank 1"),
    ]
    assert rejected == walk.passed_over, "on_reject sees each rejection, in order"
    assert walk.reasons() == [
        "ep0-ba30: rank1.pt fails its checksum",
        "ep0-ba20: not present on rank 1",
    ]


def test_checks_lazily_and_nothing_older_than_the_choice():
    checked: list[int] = []
    produced: list[int] = []

    def newest_first():
        for n in (5, 4, 3, 2, 1):
            produced.append(n)
            yield n

    def check(n: int) -> str | None:
        checked.append(n)
        return None if n == 3 else f"{n} is broken"

    walk = first_valid(newest_first(), check)
    assert walk.chosen == 3
    assert checked == [5, 4, 3]
    assert produced == [5, 4, 3], "the generator was not drained past the choice"


def test_none_valid_returns_every_reason_and_no_choice():
    walk = first_valid(["b", "a"], lambda name: f"{name} torn")
    assert walk.chosen is None
    assert walk.reasons() == ["b: b torn", "a: a torn"]
    empty = first_valid([], lambda _: None)
    assert empty.chosen is None and empty.passed_over == []


def test_a_check_that_raises_stops_the_walk():
    class StoreDownError(Exception):
        pass

    checked: list[str] = []

    def check(name: str) -> str | None:
        checked.append(name)
        if name == "b":
            raise StoreDownError(name)
        return "torn"

    with pytest.raises(StoreDownError):
        first_valid(["c", "b", "a"], check)
    assert checked == ["c", "b"], "no older candidate is tried after an outage"


def test_a_falsy_candidate_can_be_chosen():
    """The choice is told apart by the check's answer, not by the candidate's truth value."""
    walk = first_valid([0, 1], lambda n: None)
    assert walk.chosen == 0
    assert walk.passed_over == []
