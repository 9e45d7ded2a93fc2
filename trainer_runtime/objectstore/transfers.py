"""Verified file transfers between a local disk and an S3 bucket, for ``S3Store``.

Why not plain ``boto3.upload_file``/``download_file``: checkpoint files must arrive verified.
Uploads check the local bytes against the manifest's xxh3-128 *while* the parts go out (hashing
overlaps the network, and a corrupt local file is aborted before the multipart upload
completes), and record the digest as object metadata so a resolver can vet a remote checkpoint
with HEAD requests alone. Downloads fetch ranged parts in parallel straight into a preallocated
temporary file (``pwrite`` at each part's offset, no reassembly queue), hash the parts in order
as they land, fsync, and only then rename onto the final name, so a torn or corrupt download
never appears under a checkpoint's file name.

Kept apart from ``store.py`` (requests, listing, errors, the client) so each reads on its own;
call them through ``S3Store.upload_file``/``download_file``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import xxhash

from .. import io_progress
from ..save import atomic
from ..save.manifest import wrong_size
from .checksum import RangeHasher
from .errors import (
    ChecksumMismatchError,
    LocalDataError,
    ObjectNotFoundError,
    ObjectStoreError,
    error_code,
)
from .objects import META_XXH3, MiB, ObjectInfo, Store, as_uri
from .uri import S3Uri

_READ_CHUNK = 1 * MiB
_SYNC_EVERY = 64 * MiB
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class LocalWriteError(OSError):
    """A download could not be written to the local disk (full, read-only, I/O error): an
    ``OSError``, not an ``ObjectStoreError``, so nobody retries it against the store."""


def upload_file(
    store: Store,
    path: str | os.PathLike[str],
    location: S3Uri | str,
    *,
    size: int | None = None,
    xxh3: str | None = None,
    stop: threading.Event | None = None,
) -> ObjectInfo:
    """Upload one file, verified against ``size``/``xxh3`` (the manifest entry) if given.

    Raises LocalDataError when the local file is missing or does not match (not worth
    retrying), ObjectStoreError for store failures (worth retrying). The object carries its
    digest as ``x-amz-meta-xxh3-128``. Without ``xxh3`` the digest is computed first.
    """
    uri = as_uri(location, "location")
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise LocalDataError(f"cannot read {path} to upload it: {exc}") from exc
    try:
        actual = os.fstat(fd).st_size
        if size is not None and actual != size:
            raise LocalDataError(wrong_size(path, actual, size))
        if xxh3 is None:
            hasher = RangeHasher(fd)
            hasher.advance_to(actual)
            xxh3 = hasher.hexdigest()
        if actual <= store.transfer.multipart_threshold:
            _put_small(store, fd, actual, uri, xxh3=xxh3, path=path)
        else:
            _put_multipart(store, fd, actual, uri, xxh3, path=path, stop=stop)
    finally:
        os.close(fd)
    return ObjectInfo(uri=uri, size=actual, xxh3=xxh3)


def _put_small(
    store: Store, fd: int, size: int, uri: S3Uri, *, xxh3: str, path: str | os.PathLike[str]
) -> None:
    data = os.pread(fd, size, 0)
    if len(data) != size or xxhash.xxh3_128(data).hexdigest() != xxh3:
        raise LocalDataError(f"{path} does not match its manifest checksum; not uploading")
    try:
        store.client.put_object(
            Bucket=uri.bucket, Key=uri.key, Body=data, Metadata={META_XXH3: xxh3}
        )
    except Exception as exc:
        raise store.wrap_error(exc, f"PUT {uri}") from exc
    io_progress.moved(len(data))


def _put_multipart(
    store: Store,
    fd: int,
    size: int,
    uri: S3Uri,
    xxh3: str,
    *,
    path: str | os.PathLike[str],
    stop: threading.Event | None,
) -> None:
    part = store.transfer.part_size_for(size)
    try:
        upload_id = store.client.create_multipart_upload(
            Bucket=uri.bucket, Key=uri.key, Metadata={META_XXH3: xxh3}
        )["UploadId"]
    except Exception as exc:
        raise store.wrap_error(exc, f"PUT {uri} (create multipart upload)") from exc
    cancel = threading.Event()
    send = partial(
        _send_part, store, fd, uri, upload_id=upload_id, path=path, cancel=cancel, stop=stop
    )
    ranges = [(i + 1, off, min(part, size - off)) for i, off in enumerate(range(0, size, part))]
    pool = ThreadPoolExecutor(store.transfer.concurrency, thread_name_prefix="rtj-s3-put")
    futures: list[Future[dict[str, Any]]] = [pool.submit(send, r) for r in ranges]
    try:
        # Hash the local file while the parts are in flight; xxhash releases the GIL.
        hasher = RangeHasher(fd)
        hasher.advance_to(size)
        if hasher.hexdigest() != xxh3:
            raise LocalDataError(f"{path} does not match its manifest checksum; not uploading")
        parts = [f.result() for f in futures]
        store.client.complete_multipart_upload(
            Bucket=uri.bucket,
            Key=uri.key,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
        )
    except BaseException as exc:
        cancel.set()
        for f in futures:
            f.cancel()
        pool.shutdown(wait=True)
        with contextlib.suppress(Exception):
            store.client.abort_multipart_upload(Bucket=uri.bucket, Key=uri.key, UploadId=upload_id)
        if isinstance(exc, ObjectStoreError | KeyboardInterrupt | SystemExit):
            raise
        raise store.wrap_error(exc, f"PUT {uri} (multipart)") from exc
    pool.shutdown(wait=True)


def _send_part(
    store: Store,
    fd: int,
    uri: S3Uri,
    part: tuple[int, int, int],
    *,
    upload_id: str,
    path: str | os.PathLike[str],
    cancel: threading.Event,
    stop: threading.Event | None,
) -> dict[str, Any]:
    """Upload ``part`` (its number, then ``length`` bytes of ``fd`` from ``offset``); returns
    what ``complete_multipart_upload`` lists of it (its ETag and checksums)."""
    number, offset, length = part
    if cancel.is_set() or (stop is not None and stop.is_set()):
        raise ObjectStoreError(f"PUT {uri}: cancelled")
    body = os.pread(fd, length, offset)
    if len(body) != length:
        raise LocalDataError(f"{path} shrank while being uploaded")
    resp = store.client.upload_part(
        Bucket=uri.bucket, Key=uri.key, UploadId=upload_id, PartNumber=number, Body=body
    )
    io_progress.moved(length)
    done = {"PartNumber": number, "ETag": resp["ETag"]}
    done.update({k: v for k, v in resp.items() if k.startswith("Checksum") and k != "ChecksumType"})
    return done


def download_file(
    store: Store,
    location: S3Uri | str,
    dest: str | os.PathLike[str],
    *,
    size: int | None = None,
    xxh3: str | None = None,
    stop: threading.Event | None = None,
) -> ObjectInfo:
    """Download to ``dest`` atomically, verified against ``size``/``xxh3`` when given.

    With ``size`` known (from a manifest) no HEAD is spent: every ranged GET's reply is
    checked instead (total size, one ETag across parts, the xxh3 metadata). Without
    ``xxh3`` the object's own ``xxh3-128`` metadata is checked, if it has one. On any
    failure nothing is left under ``dest`` (ChecksumMismatchError for bad bytes or size,
    ObjectNotFoundError when the object is gone, ObjectStoreError for other store failures,
    ``LocalWriteError``, an OSError, when the local disk cannot take the bytes).
    """
    uri = as_uri(location, "location")
    info: ObjectInfo | None = None
    if size is None or size == 0:
        info = store.head(uri)
        if info is None:
            raise ObjectNotFoundError(f"GET {uri}: not found")
        if size is not None and info.size != size:
            raise ChecksumMismatchError(f"{uri} has {info.size} bytes, expected {size}")
        size = info.size
    guard = _ReplyGuard(uri, size, xxh3, info)
    final = Path(dest)
    tmp = atomic.temp_name(final)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        if size:
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno in _DISK_FULL:  # the file cannot fit: say so before any GET
                    raise LocalWriteError(
                        exc.errno, f"{exc.strerror}: {final} needs {size} bytes"
                    ) from exc
                os.ftruncate(fd, size)  # a filesystem without fallocate
        digest = _fetch_into(store, fd, uri, size, guard=guard, stop=stop)
        expected = xxh3 or guard.xxh3
        if expected and digest != expected:
            raise ChecksumMismatchError(
                f"{uri}: downloaded bytes fail their checksum (got {digest}, expected {expected})"
            )
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, final)
        atomic.fsync_dir(final.parent)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return ObjectInfo(uri=uri, size=size, etag=guard.etag or "", xxh3=guard.xxh3)


def _fetch_into(
    store: Store,
    fd: int,
    uri: S3Uri,
    size: int,
    *,
    guard: _ReplyGuard,
    stop: threading.Event | None,
) -> str:
    """Write the object's ``size`` bytes into ``fd``; returns their xxh3-128 digest."""
    part = store.transfer.part_size_for(size)
    if size <= store.transfer.multipart_threshold:
        part = max(size, 1)
    cancel = threading.Event()
    fetch = partial(_fetch_range, store, fd, uri, size=size, guard=guard, cancel=cancel, stop=stop)
    hasher = RangeHasher(fd)
    if size == 0:
        return hasher.hexdigest()
    ranges = [(off, min(part, size - off)) for off in range(0, size, part)]
    if len(ranges) == 1:
        fetch(ranges[0])
        hasher.advance_to(size)
        return hasher.hexdigest()
    pool = ThreadPoolExecutor(store.transfer.concurrency, thread_name_prefix="rtj-s3-get")
    futures = [pool.submit(fetch, r) for r in ranges]
    try:
        # Hash each part as soon as it and all before it have landed (page cache reads),
        # and flush what has landed every _SYNC_EVERY bytes: the disk writes overlap the
        # network instead of all waiting for the final fsync.
        synced = 0
        for (off, length), fut in zip(ranges, futures, strict=True):
            fut.result()
            hasher.advance_to(off + length)
            if hasher.offset - synced >= _SYNC_EVERY:
                os.fdatasync(fd)
                synced = hasher.offset
    except BaseException:
        cancel.set()
        for f in futures:
            f.cancel()
        raise
    finally:
        pool.shutdown(wait=True)
    return hasher.hexdigest()


def _fetch_range(
    store: Store,
    fd: int,
    uri: S3Uri,
    span: tuple[int, int],
    *,
    size: int,
    guard: _ReplyGuard,
    cancel: threading.Event,
    stop: threading.Event | None,
) -> None:
    """GET ``span`` (offset, length) of the object (``size`` bytes in all) into ``fd`` at the
    same offset; a store's error is an ObjectStoreError (ChecksumMismatchError when the object
    is shorter than ``size``), the local disk's a LocalWriteError."""
    offset, length = span
    if cancel.is_set() or (stop is not None and stop.is_set()):
        raise ObjectStoreError(f"GET {uri}: cancelled")
    args: dict[str, Any] = {"Bucket": uri.bucket, "Key": uri.key}
    if guard.etag:
        args["IfMatch"] = guard.etag  # the object must not change under us
    ranged = length != size
    if ranged:
        args["Range"] = f"bytes={offset}-{offset + length - 1}"
    try:
        resp = store.client.get_object(**args)
        guard.check(resp, ranged=ranged)
        _write_body(resp["Body"], fd, offset, offset + length, uri=uri, cancel=cancel)
    except (ObjectStoreError, LocalWriteError):
        raise
    except Exception as exc:
        if error_code(exc) in ("InvalidRange", "416"):
            raise ChecksumMismatchError(f"{uri} is shorter than {size} bytes") from exc
        if error_code(exc) in ("PreconditionFailed", "412"):
            raise ObjectStoreError(f"GET {uri}: the object changed mid-download") from exc
        raise store.wrap_error(exc, f"GET {uri}") from exc


def _write_body(
    body: Any, fd: int, pos: int, end: int, *, uri: S3Uri, cancel: threading.Event
) -> None:
    """Copy a GET reply's body into ``fd`` from ``pos`` to ``end``, then close it."""
    while pos < end:
        if cancel.is_set():
            raise ObjectStoreError(f"GET {uri}: cancelled")
        chunk = body.read(min(_READ_CHUNK, end - pos))
        if not chunk:
            raise ObjectStoreError(f"GET {uri}: connection ended at byte {pos}")
        view = memoryview(chunk)
        while view:
            try:
                n = os.pwrite(fd, view, pos)
            except OSError as exc:  # the local disk's failure, not the store's
                raise LocalWriteError(
                    exc.errno, f"{exc.strerror} (writing the download of {uri})"
                ) from exc
            view = view[n:]
            pos += n
    body.close()


class _ReplyGuard:
    """Checks every GET reply of one download against the others and the manifest entry.

    Stands in for a HEAD before the download: the first reply fixes the ETag (later parts
    must match it, and are then asked for with If-Match), each reply's total size must be the
    manifest's, and the object's xxh3 metadata, when present, must be the manifest's digest.
    """

    def __init__(self, uri: S3Uri, size: int, xxh3: str | None, info: ObjectInfo | None) -> None:
        self.uri, self.size, self.expected = uri, size, xxh3
        self.etag = info.etag if info is not None and info.etag else None
        self.xxh3 = info.xxh3 if info is not None else None
        self._lock = threading.Lock()

    def check(self, resp: Mapping[str, Any], *, ranged: bool) -> None:
        if ranged:
            total = str(resp.get("ContentRange", "")).rpartition("/")[2]
        else:
            total = str(resp.get("ContentLength", ""))
        if total.isdigit() and int(total) != self.size:
            raise ChecksumMismatchError(f"{self.uri} has {total} bytes, expected {self.size}")
        meta = {k.lower(): v for k, v in (resp.get("Metadata") or {}).items()}
        digest = meta.get(META_XXH3)
        if self.expected and digest and digest != self.expected:
            raise ChecksumMismatchError(
                f"{self.uri} carries checksum {digest}, expected {self.expected}"
            )
        etag = str(resp.get("ETag", "")) or None
        with self._lock:
            if self.etag is None:
                self.etag, self.xxh3 = etag, digest
            elif etag is not None and etag != self.etag:
                raise ObjectStoreError(f"GET {self.uri}: the object changed mid-download")
