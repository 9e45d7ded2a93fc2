"""Events are posted in the background, a few at a time, in order (act/events.py)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from rtj_operator.act.events import POSTS_IN_FLIGHT, EventPoster
from rtj_operator.api.api_types import JobRef
from rtj_operator.decide.plan_types import EventSpec


class SlowApi:
    """Answers each post after a pause and records how many were under way at once."""

    def __init__(self) -> None:
        self.posted: list[tuple[str, str]] = []
        self.in_flight = self.most_in_flight = 0

    async def post_event(
        self, involved: dict[str, Any], type_: str, reason: str, message: str, now_iso: str
    ) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        if reason == "Refused":
            raise RuntimeError("403 forbidden")
        self.posted.append((involved["name"], reason))


def test_a_burst_of_events_is_posted_a_few_at_a_time_each_jobs_in_order():
    api = SlowApi()

    async def burst() -> None:
        poster = EventPoster(api)  # type: ignore[arg-type]
        now = datetime.now(UTC)
        for job in range(20):
            ref = JobRef(f"job-{job}", "ns", f"uid-{job}", generation=1, resource_version="1")
            reasons = ["Preempted", "Refused", "Resubmitted"]
            poster.post(ref, [EventSpec("Normal", r, f"{r} {job}") for r in reasons], now)
        await asyncio.gather(*poster.tasks)

    asyncio.run(burst())
    assert api.most_in_flight == POSTS_IN_FLIGHT
    # A refused post is only logged; the job's next one still goes out, after the one before.
    for job in range(20):
        mine = [reason for name, reason in api.posted if name == f"job-{job}"]
        assert mine == ["Preempted", "Resubmitted"], (job, mine)
