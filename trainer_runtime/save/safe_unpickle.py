"""The small state must load with torch's weights-only unpickler: checked when saved, and
an unloadable one is an invalid checkpoint when resumed.

Checkpoints are read with ``torch.load(weights_only=True)`` unless ``trusted_pickle=True``
(docs/runtime.md), so an object of another class in ``extras``, ``metrics`` or a stateful
object's ``state_dict()`` would be written without complaint and then make every resume fail.
The save refuses it instead, before anything is written, naming the key; the check scans the
pickle ``capture`` already produced for the classes it names (no second serialization, no
load). A checkpoint written before the check, or by hand, is passed over by resume with the
reason instead of raising torch's ``UnpicklingError``. (Rejected: a list of allowed Python
types kept here, which would drift from torch's own allowlist and ignore
``torch.serialization.add_safe_globals``.)
"""

from __future__ import annotations

import io
import logging
from typing import Any, BinaryIO

import torch

from ..errors import ConfigError

log = logging.getLogger("trainer_runtime")

ALLOWED = (
    "tensors and plain Python values (None, bool, int, float, complex, str, bytes, and lists, "
    "tuples, sets and dicts of them)"
)

_WHERE = {
    "extras": "ckpt.extras",
    "metrics": "ckpt.metrics",
    "stateful": "the state_dict() of stateful",
    "schedulers": "the state_dict() of scheduler",
}


def refused_globals(blob: bytes | BinaryIO) -> list[str]:
    """The classes and functions in ``torch.save``'s ``blob`` (bytes, or a file open on them)
    that the weights-only unpickler refuses (those registered with ``add_safe_globals`` are
    allowed). The pickle is scanned; nothing is loaded."""
    source = io.BytesIO(blob) if isinstance(blob, bytes) else blob
    return list(torch.serialization.get_unsafe_globals_in_checkpoint(source))


def refusal(refused: list[str]) -> str:
    """Why a saved state with the ``refused`` globals does not load, for a resume's reasons."""
    return (
        f"holds {', '.join(refused)}, which the weights-only unpickler refuses "
        "(trusted_pickle=True loads it, if you trust the checkpoint)"
    )


def serialize(data: dict[str, Any], *, trusted: bool) -> bytes:
    """``torch.save(data)``, refused with a ``ConfigError`` naming the key at fault when it
    cannot be pickled, or (unless ``trusted``) would not load with the weights-only
    unpickler."""
    buf = io.BytesIO()
    try:
        torch.save(data, buf)
    except Exception as exc:  # pickle raises several types for an unpicklable object
        where = _locate(data.get("state", {})) or "the checkpoint's small state"
        raise ConfigError(
            f"{where} cannot be saved ({type(exc).__name__}: {exc}); nothing was saved. "
            f"Keep it to {ALLOWED}"
        ) from exc
    blob = buf.getvalue()
    check_loadable(data, blob, trusted=trusted)
    return blob


def check_loadable(data: dict[str, Any], blob: bytes, *, trusted: bool) -> None:
    """Raise ``ConfigError`` naming the first key of ``data["state"]`` whose value the
    weights-only unpickler would refuse; ``blob`` is ``torch.save(data)``."""
    if trusted:
        return
    refused = refused_globals(blob)
    if not refused:
        return
    where = _locate(data.get("state", {})) or "the checkpoint's small state"
    raise ConfigError(
        f"{where} holds {', '.join(refused)}, which the weights-only unpickler that loads "
        f"checkpoints refuses, so no resume could read this checkpoint; nothing was saved. "
        f"Keep it to {ALLOWED}, or register the class with "
        "torch.serialization.add_safe_globals (in the resuming process too), or pass "
        "trusted_pickle=True"
    )


def describe_unloadable(blob: bytes, exc: Exception, *, trusted: bool) -> str:
    """Why a saved small state does not load, in one line."""
    try:
        refused = [] if trusted else refused_globals(blob)
    except Exception:  # not a torch.save blob at all
        refused = []
    if refused:
        return f"it {refusal(refused)}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}"


def _locate(state: dict[str, Any]) -> str | None:
    """The friendliest name of the part of ``state`` that holds a refused object."""
    for part, label in _WHERE.items():
        values = state.get(part)
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            if _refuses(value):
                return f"{label}[{key!r}]"
    for part, value in state.items():
        if _refuses(value):
            return f"state/{part}"
    return None


def _refuses(value: Any) -> bool:
    """``value`` cannot be pickled, or its pickle names a class the unpickler refuses."""
    buf = io.BytesIO()
    try:
        torch.save(value, buf)
    except Exception:
        return True
    return bool(refused_globals(buf.getvalue()))
