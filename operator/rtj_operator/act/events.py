"""Events about a job, posted in the background.

An Event is the user's word on what happened, never a step of a decision: posting one must never
delay or fail a resubmission, so each batch is posted by a task of its own, in order, and a
refusal is only logged. The tasks are kept (``tasks``) so that they are not collected mid-post
and so that tests can wait for them.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime

from ..api import names
from ..api.api_types import JobRef
from ..api.timeutil import iso
from ..decide.plan_types import EventSpec
from .kube import KubeApi

log = logging.getLogger(__name__)


class EventPoster:
    """Posts the Events of one operator process (fire and forget)."""

    def __init__(self, api: KubeApi):
        self.api = api
        self.tasks: set[asyncio.Task[None]] = set()
        """The posts still under way."""

    def post(self, ref: JobRef, events: list[EventSpec], now: datetime) -> None:
        """Post ``events`` about the job in the background, in order (fire and forget)."""
        if not events:
            return
        involved = {
            "apiVersion": names.API_VERSION,
            "kind": names.KIND,
            "name": ref.name,
            "namespace": ref.namespace,
            "uid": ref.uid,
        }

        async def post() -> None:
            for event in events:
                try:
                    await self.api.post_event(
                        involved, event.type, event.reason, event.message, iso(now)
                    )
                except Exception as err:
                    log.warning("could not post event %s for %s: %s", event.reason, ref.name, err)

        task = asyncio.ensure_future(post())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
