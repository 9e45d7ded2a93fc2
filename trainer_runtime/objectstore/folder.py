"""A run folder in an object store, as a ``layout.Location``: ``RunFolder(StorePrefix(...))``.

The listing, ordering and manifest rules are ``layout.RunFolder``'s, shared with local run
folders; this adapter only says how to read a prefix through ``S3Store``: folders are common
prefixes, manifests are fetched in parallel (one GET each), and a checkpoint's files are
verified by HEAD (size and the xxh3 recorded at upload; the bytes themselves are checked when
downloaded). A listing may lag a fresh pointer, so the checkpoint ``latest.json`` names is
always a candidate. (Rejected: a remote twin of ``RunFolder`` with its own listing, which is
what the resolver, the pruner and the set-aside each had.)
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from ..errors import ManifestError
from ..run_folder.layout import NoManifest, RunFolder, misnamed
from ..run_folder.names import MANIFEST_NAME, POINTER_NAME
from ..save.manifest import Manifest, entry_label, wrong_size
from .errors import ObjectStoreError
from .store import S3Store
from .uri import S3Uri, parse_s3_uri

log = logging.getLogger(__name__)


class StorePrefix:
    """``s3://bucket/prefix/<run>`` read through one ``S3Store``."""

    listing_may_lag = True

    def __init__(self, store: S3Store, run_uri: S3Uri | str) -> None:
        self.store = store
        self.run_uri = run_uri if isinstance(run_uri, S3Uri) else parse_s3_uri(run_uri)

    def describe(self) -> str:
        return str(self.run_uri)

    def folder_names(self) -> list[str]:
        return [n for n in self.store.list_folders(self.run_uri) if not n.startswith(".")]

    def manifests(self, names: list[str]) -> dict[str, Manifest | NoManifest]:
        return remote_manifests(self.store, self.run_uri, names)

    def read_pointer(self) -> dict | None:
        uri = self.run_uri.join(POINTER_NAME)
        try:
            body = self.store.get_json(uri)
        except ValueError as exc:
            log.warning("object store: %s does not parse (%s); ignoring it", uri, exc)
            return None
        return body if isinstance(body, dict) else None

    def verify(self, manifest: Manifest, ranks: list[int] | None) -> str | None:
        return verify_remote(self.store, self.run_uri, manifest, ranks)


def remote_manifests(
    store: S3Store, run_uri: S3Uri, names: list[str] | None = None
) -> dict[str, Manifest | NoManifest]:
    """Each checkpoint folder's manifest, or the reason it has none that parses."""
    if names is None:
        names = store.list_folders(run_uri)

    def load(name: str) -> Manifest | NoManifest:
        uri = run_uri.join(name, MANIFEST_NAME)
        try:
            data = store.get_bytes(uri)
        except ObjectStoreError as exc:
            return NoManifest(f"cannot read {uri}: {exc}", damaged=False)  # unknown: not damage
        if data is None:
            return NoManifest(f"{uri} does not exist (not committed)", damaged=False)
        try:
            manifest = Manifest.from_json(data, source=str(uri))
        except ManifestError as exc:
            return NoManifest(str(exc), damaged=True)
        if manifest.name != name:
            return NoManifest(misnamed(run_uri.join(name), manifest.name), damaged=False)
        return manifest

    if not names:
        return {}
    with ThreadPoolExecutor(min(8, len(names)), thread_name_prefix="rtj-s3-list") as pool:
        return dict(zip(names, pool.map(load, names), strict=True))


def verify_remote(
    store: S3Store,
    run_uri: S3Uri,
    manifest: Manifest,
    ranks: list[int] | None = None,
    *,
    require_digest: bool = False,
) -> str | None:
    """None when every file (of ``ranks``) is remote with the manifest's size and no other
    digest than the manifest's.

    An object without digest metadata (copied into the bucket by a tool that drops it, such as
    an upload from a local backup) is not a broken one: the download checks its bytes against
    the manifest. With ``require_digest`` (retention, which deletes on the strength of this
    check) such an object does not count.
    """
    ckpt = run_uri.join(manifest.name)
    for entry in manifest.files:
        if ranks is not None and entry.rank not in ranks:
            continue
        info = store.head(ckpt.join(entry.path))
        if info is None:
            return f"{entry_label(entry)} is missing remotely"
        if info.size != entry.size:
            return wrong_size(entry_label(entry), info.size, entry.size, where=" remotely")
        if info.xxh3 != entry.xxh3_128 and (info.xxh3 is not None or require_digest):
            return (
                f"{entry_label(entry)} carries checksum {info.xxh3}, manifest says {entry.xxh3_128}"
            )
    return None


def remote_run_folder(store: S3Store, run_uri: S3Uri | str) -> RunFolder:
    """The run folder model of ``run_uri`` in ``store``."""
    return RunFolder(StorePrefix(store, run_uri))
