"""Which optional APIs the cluster serves (PodGroup, Kueue), asked through API discovery.

Every reconcile pass needs the answers (gang.py picks the mechanism from them), so they are
cached: at most one request per API a minute. A failed request keeps the previous answer, so an
API server hiccup never flips a job to another mechanism. A command-line flag was rejected: it is
wrong on half the clusters it is copied to, and discovery costs one GET a minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from ..decide import gang
from .kube import ApiError, KubeApi

log = logging.getLogger(__name__)

DISCOVERY_SECONDS = 60.0
"""How long an answer of API discovery is trusted."""


class ApiDiscovery:
    """Cached answers of API discovery for one operator process."""

    def __init__(self, api: KubeApi):
        self.api = api
        self._answers: dict[str, tuple[bool, float]] = {}
        """Per API group: (answer, monotonic time it was asked)."""

    async def pod_groups(self) -> bool:
        """Whether the cluster serves the PodGroup API (native gang scheduling)."""
        return await self._ask(gang.GROUP_VERSION, self.api.serves_pod_groups)

    async def kueue(self) -> bool:
        """Whether the cluster serves Kueue's API (Kueue is installed)."""
        return await self._ask(gang.KUEUE_GROUP, self.api.serves_kueue)

    async def _ask(self, group: str, probe: Callable[[], Awaitable[bool]]) -> bool:
        now = time.monotonic()
        known = self._answers.get(group)
        if known is None or now - known[1] > DISCOVERY_SECONDS:
            try:
                answer = await probe()
            except ApiError as err:
                log.warning("API discovery of %s failed: %s", group, err)
                answer = known[0] if known else False
            known = self._answers[group] = (answer, now)
        return known[0]
