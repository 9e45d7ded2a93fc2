"""What the operator says about a job it cannot parse, so its user is not left guessing.

The CRD's schema and CEL rules refuse such an object at ``kubectl apply``; one still reaches the
operator when the installed CRD is older than the operator, when the API server does not enforce
CEL, or when it was stored before a rule existed. The operator then acts on nothing (no pod is
created, deleted or annotated: the spec it would act from is not one it can trust) and says why
on the object, once per generation of the spec: condition ``Blocked=True``, reason
``InvalidSpec``, naming each failing field and what it expects, and one Warning event
``InvalidSpec`` with the same text. The job's next parse that succeeds turns ``Blocked`` False.

Rejected: failing the job. Its pods may run from an earlier, valid spec, and the user's fix (a
corrected spec) must let it go on from where it was, not leave it Failed.

The status here is the raw one: it may be missing or malformed too (it is part of what does not
parse), so the condition is written into the stored conditions list as it is, never through the
status model (``conditions.upsert_stored``, beside the model's ``set_condition``: conditions.py
is the one module that writes conditions).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ..api.status_types import JobStatus
from . import conditions as cond

INVALID_SPEC = "InvalidSpec"
SPEC_VALID = "SpecValid"
MAX_ERRORS = 5
"""Errors named in the message; the rest are counted."""
MAX_MESSAGE = 1000
"""Bound of the message (an Event's message is cut there too)."""


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out


def describe(err: ValidationError) -> str:
    """The failing fields and what each expects, shortened: ``spec.replicas: Input should be
    greater than or equal to 1; spec: containerName must name one of ...``."""
    errors = err.errors()
    parts = []
    for error in errors[:MAX_ERRORS]:
        where = _where(tuple(error.get("loc") or ()))
        what = str(error.get("msg", "")).removeprefix("Value error, ")
        parts.append(f"{where}: {what}" if where else what)
    if len(errors) > MAX_ERRORS:
        parts.append(f"and {len(errors) - MAX_ERRORS} more")
    text = "the job does not parse, so the operator leaves it and its pods alone until it is "
    text += "fixed: " + "; ".join(parts)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


def blocked_conditions(
    raw_status: Any, generation: int, message: str, now: datetime
) -> list[dict[str, Any]] | None:
    """The status conditions with ``Blocked=True``/``InvalidSpec`` for ``message``, or None when
    the stored ones already say it of this generation (reported already: no event again)."""
    status = raw_status if isinstance(raw_status, dict) else {}
    stored = status.get("conditions")
    stored = [c for c in stored if isinstance(c, dict)] if isinstance(stored, list) else []
    old = next((c for c in stored if c.get("type") == cond.BLOCKED), None)
    was_true = old is not None and old.get("status") == "True"
    if (
        was_true
        and old.get("reason") == INVALID_SPEC
        and old.get("observedGeneration") == generation
    ):
        # Keyed by generation, not message: the write itself may change what the status's
        # errors say (a junk condition dropped), and that must not report it again.
        return None
    return cond.upsert_stored(
        stored,
        cond.BLOCKED,
        True,
        reason=INVALID_SPEC,
        message=message,
        now=now,
        generation=generation,
    )


def parses_again(status: JobStatus, *, now: datetime, generation: int) -> None:
    """The job parses: a ``Blocked`` of an invalid spec is over."""
    had = cond.condition(status, cond.BLOCKED)
    if had is not None and had.status == "True" and had.reason == INVALID_SPEC:
        cond.set_condition(
            status,
            cond.BLOCKED,
            False,
            reason=SPEC_VALID,
            message="the spec parses: the operator reconciles the job again",
            now=now,
            generation=generation,
        )
