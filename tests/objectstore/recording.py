"""An S3Store that records the order in which objects become visible, for ordering tests."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime.objectstore import S3Store, S3Uri


@dataclass
class Recorder:
    """A shared, ordered log of (sequence, event, key, who) across stores and threads."""

    events: list[tuple[int, str, str, str]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _seq: itertools.count = field(default_factory=itertools.count)

    def add(self, event: str, key: str, who: str) -> None:
        with self._lock:
            self.events.append((next(self._seq), event, key, who))

    def seq(self, event: str, suffix: str) -> list[int]:
        return [s for s, e, k, _ in self.events if e == event and k.endswith(suffix)]

    def keys(self, who: str) -> list[str]:
        return [k for _, e, k, w in self.events if w == who and e == "uploaded"]


class RecordingStore(S3Store):
    """Logs when each data upload *finished* and when each small PUT *started*.

    Data before manifest before pointer is then a comparison of sequence numbers: a PUT that
    starts after an upload finished cannot have become visible before it.
    """

    def __init__(
        self, recorder: Recorder, who: str, *, upload_delay: float = 0.0, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.recorder = recorder
        self.who = who
        self.upload_delay = upload_delay

    def upload_file(self, path: Any, location: S3Uri | str, **kwargs: Any) -> Any:
        time.sleep(self.upload_delay)
        info = super().upload_file(path, location, **kwargs)
        self.recorder.add("uploaded", str(location), self.who)
        return info

    def put_bytes(self, location: S3Uri | str, data: bytes, **kwargs: Any) -> None:
        self.recorder.add("put", str(location), self.who)
        super().put_bytes(location, data, **kwargs)
