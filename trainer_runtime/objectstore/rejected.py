"""Uncommitting, in the bucket, a checkpoint that resume rejected (see ``resume/rejection.py``).

The bucket's half of moving a rejected checkpoint aside. S3 has no rename, and copying a
multi-gigabyte checkpoint to keep it costs as much as uploading it again, so the evidence kept
is the manifest and the reason (``<run>/rejected/<name>/manifest.json`` and ``reason.json``);
the checkpoint itself is then deleted manifest first, exactly as retention prunes one
(``run_folder.set_aside.set_aside_in_bucket``). If
``latest.json`` named it, the pointer moves to the newest checkpoint still committed (it never
names an uncommitted one), or is deleted when none is left.
"""

from __future__ import annotations

import contextlib
import logging

from ..errors import ManifestError
from ..run_folder.layout import pointer_body
from ..run_folder.names import MANIFEST_NAME, POINTER_NAME
from ..run_folder.set_aside import set_aside_in_bucket
from ..save.manifest import Manifest
from ..timestamp import Timestamp
from .folder import remote_run_folder
from .store import S3Store
from .uri import S3Uri

log = logging.getLogger(__name__)


def reject_remote(
    store: S3Store, run_uri: S3Uri, name: str, reason: str, *, newer_than: Timestamp
) -> bool:
    """Set checkpoint ``name`` aside when it is committed remotely and newer than
    ``newer_than`` (the position training goes on from); returns whether it was."""
    ckpt = run_uri.join(name)
    body = store.get_bytes(ckpt.join(MANIFEST_NAME))
    if body is None:
        return False
    try:
        manifest = Manifest.from_json(body, source=str(ckpt.join(MANIFEST_NAME)))
    except ManifestError:
        manifest = None
    if manifest is not None and manifest.timestamp.sort_key() <= newer_than.sort_key():
        return False  # older than the resume position: it blocks nothing
    aside = set_aside_in_bucket(store, run_uri, name, body, reason)
    _repoint_after(store, run_uri, name)
    log.warning("object store: set rejected checkpoint %s aside (%s): %s", ckpt, aside, reason)
    return True


def _repoint_after(store: S3Store, run_uri: S3Uri, removed: str) -> None:
    pointer_uri = run_uri.join(POINTER_NAME)
    current = None
    with contextlib.suppress(ValueError):
        current = store.get_json(pointer_uri)
    if not isinstance(current, dict) or current.get("checkpoint") != removed:
        return
    committed = [m for m in remote_run_folder(store, run_uri).committed() if m.name != removed]
    if committed:
        store.put_json(pointer_uri, pointer_body(committed[0]))  # newest first
    else:
        store.delete(pointer_uri)


def repair_pointer(store: S3Store, run_uri: S3Uri) -> str | None:
    """Move ``latest.json`` off a folder whose manifest is missing or does not parse (damaged
    from outside: the pointer is written only after its manifest) onto the newest committed
    checkpoint; otherwise uploads would keep it there, since the pointer never moves back.
    Returns the name it named when it moved."""
    folder = remote_run_folder(store, run_uri)
    named = folder.pointer_name()
    if named is None or folder.is_committed(named):
        return None
    _repoint_after(store, run_uri, named)
    log.warning(
        "object store: latest.json named %s, which has no valid manifest; it now names the "
        "newest committed checkpoint",
        run_uri.join(named),
    )
    return named
