"""Parsing and producing the RFC 3339 times the API server uses, always timezone-aware UTC."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    """Current time, aware, in UTC (the only clock the pure modules are ever given)."""
    return datetime.now(UTC)


def parse_time(value: str | datetime | None) -> datetime | None:
    """Parse an API timestamp (``2024-01-02T03:04:05Z``, optional fraction); None when absent."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def iso(value: datetime) -> str:
    """RFC 3339 with millisecond precision and a ``Z``."""
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
