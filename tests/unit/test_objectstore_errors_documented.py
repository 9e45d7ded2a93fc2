"""Every exception docs/object-store.md names is one a user can import and catch."""

from __future__ import annotations

import builtins
import re
from pathlib import Path

import trainer_runtime
import trainer_runtime.objectstore

DOC = Path(__file__).resolve().parents[2] / "docs" / "object-store.md"


def test_every_error_the_object_store_docs_name_is_importable() -> None:
    named = set(re.findall(r"`([A-Z][A-Za-z]*Error)`", DOC.read_text()))
    assert {"ObjectStoreConfigError", "LocalWriteError", "ChecksumMismatchError"} <= named
    missing = [
        name
        for name in sorted(named)
        if not any(
            hasattr(m, name) for m in (builtins, trainer_runtime, trainer_runtime.objectstore)
        )
    ]
    assert missing == [], f"named in docs/object-store.md, not importable: {missing}"
    assert issubclass(trainer_runtime.objectstore.LocalWriteError, OSError)
