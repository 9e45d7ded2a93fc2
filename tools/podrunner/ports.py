"""Local ports that stand in for a Service's rendezvous port, agreed across agent processes.

All pods share 127.0.0.1, so two attempts of one job (the old gang still saving in its grace
period while the new one starts) would fight over the same MASTER_PORT, and so would two jobs.
Each rendezvous key (namespace, original MASTER_ADDR, original MASTER_PORT) therefore gets its
own local port. Ranks of one gang run under different agent processes (one per Node), so the
choice must be the same in every process: the first agent to ask picks a port starting from a
hash of the key (stable across runs, handy in logs), skipping ports that are taken or bound, and
records it in a small JSON registry in the shared state folder, under an exclusive ``flock``;
every later asker reads the recorded port. Entries unused for ``ttl_s`` are forgotten.

Rejected: a pure hash without a registry (two keys can collide, and a bound port would send
different agents to different fallbacks); a port server (one more process to start and lose).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

LOW, HIGH = 20000, 45000


def port_is_free(port: int) -> bool:
    """Whether nothing listens on (or holds) 127.0.0.1:port right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def hashed_port(key: str, low: int = LOW, high: int = HIGH) -> int:
    """The first port tried for ``key``."""
    digest = hashlib.sha256(key.encode()).digest()
    return low + int.from_bytes(digest[:8], "big") % (high - low)


class PortRegistry:
    """``port_for(key)``: the same local port for the same key, in every agent process."""

    def __init__(
        self, state_dir: Path, *, low: int = LOW, high: int = HIGH, ttl_s: float = 24 * 3600.0
    ) -> None:
        self.path = state_dir / "ports.json"
        self.lock_path = state_dir / "ports.lock"
        self.low, self.high, self.ttl_s = low, high, ttl_s
        state_dir.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.lock_path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _load(self) -> dict[str, dict[str, int | float]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, entries: dict[str, dict[str, int | float]]) -> None:
        tmp = self.path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True))
        os.replace(tmp, self.path)

    def port_for(self, key: str) -> int:
        """The key's port: the recorded one, else a free one near the key's hash (recorded)."""
        with self._locked():
            now = time.time()
            entries = {
                k: v for k, v in self._load().items() if now - float(v.get("used", 0)) < self.ttl_s
            }
            entry = entries.get(key)
            if entry is None:
                taken = {int(v["port"]) for v in entries.values()}
                entry = {"port": self._pick(key, taken)}
            entry["used"] = now
            entries[key] = entry
            self._save(entries)
            return int(entry["port"])

    def _pick(self, key: str, taken: set[int]) -> int:
        span = self.high - self.low
        start = hashed_port(key, self.low, self.high) - self.low
        for step in range(span):
            port = self.low + (start + step) % span
            if port not in taken and port_is_free(port):
                return port
        raise RuntimeError(f"no free port in {self.low}-{self.high} for {key}")
