"""``S3Store``: the runtime's one door to an S3 (or S3-compatible) bucket.

Why not plain ``boto3.upload_file``/``download_file``: checkpoint files must arrive verified.
Uploads here check the local bytes against the manifest's xxh3-128 *while* the parts go out
(hashing overlaps the network, and a corrupt local file is aborted before the multipart upload
completes), and record the digest as object metadata so a resolver can vet a remote checkpoint
with HEAD requests alone. Downloads fetch ranged parts in parallel straight into a preallocated
temporary file (``pwrite`` at each part's offset, no reassembly queue), hash the parts in order as
they land, fsync, and only then rename onto the final name, so a torn or corrupt download never
appears under a checkpoint's file name.

Endpoint: boto3 reads ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` itself; when neither is set,
``S3_ENDPOINT_URL`` (Composer's spelling) is used. Credentials come only from boto3's chain and
are never logged or stored. boto3 is imported lazily so ``trainer_runtime`` works without it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import xxhash

from .. import atomic
from ..envvars import S3_ENDPOINT_URL
from .checksum import RangeHasher
from .errors import (
    ChecksumMismatchError,
    LocalDataError,
    ObjectNotFoundError,
    ObjectStoreConfigError,
    ObjectStoreError,
)
from .uri import S3Uri, parse_s3_uri

if TYPE_CHECKING:
    from botocore.client import BaseClient

log = logging.getLogger(__name__)

META_XXH3 = "xxh3-128"
"""User-metadata key (``x-amz-meta-xxh3-128``) holding the object's xxh3-128 hex digest."""

MiB = 1 << 20
_READ_CHUNK = 1 * MiB
_SYNC_EVERY = 64 * MiB
_MAX_PARTS = 10_000  # S3's limit on parts of one multipart upload
_NOT_FOUND = {"404", "NoSuchKey", "NotFound", "NoSuchUpload"}
_NO_BUCKET = {"NoSuchBucket"}
_DENIED = {
    "403",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "InvalidToken",
    "ExpiredToken",
    "InvalidClientTokenId",
    "AllAccessDisabled",
    "AccountProblem",
}


@dataclass(frozen=True)
class TransferSettings:
    """Part size and parallelism for large transfers.

    Defaults were tuned with ``benchmarks/object_store.py`` against a local server (16 MiB parts,
    8 streams); against a remote region more streams usually help (network latency, not the
    CPU, is the bound). Part size grows by itself so a file never needs more than 10,000 parts.
    """

    part_size: int = 16 * MiB
    concurrency: int = 8
    multipart_threshold: int = 32 * MiB
    """Files at or below this size go in one PUT / one GET."""

    def part_size_for(self, size: int) -> int:
        part = max(5 * MiB, self.part_size)
        while size > part * _MAX_PARTS:
            part *= 2
        return part


@dataclass(frozen=True)
class ObjectInfo:
    """What a HEAD or a listing says about one object."""

    uri: S3Uri
    size: int
    etag: str = ""
    xxh3: str | None = None
    last_modified: float = 0.0
    metadata: Mapping[str, str] = field(default_factory=dict)


def resolve_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """The endpoint to pass to boto3: None when boto3 will find one itself (or use AWS)."""
    env = os.environ if environ is None else environ
    if env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"):
        return None  # boto3's own configuration; it also honours the shared config file
    return env.get(S3_ENDPOINT_URL) or None


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError ("" for anything else)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status:
            return str(status)
    return ""


class S3Store:
    """One boto3 S3 client plus verified parallel transfers; safe to share between threads."""

    def __init__(
        self,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        transfer: TransferSettings | None = None,
        max_attempts: int = 5,
        connect_timeout: float = 5.0,
        read_timeout: float = 60.0,
        addressing_style: str | None = None,
        client: BaseClient | None = None,
    ) -> None:
        """Build the client; no request is made here (``check_access`` is the first one).

        ``max_attempts`` is botocore's per-request retry budget (standard mode: connection
        errors, 5xx, throttling); callers retry whole transfers on top of it.
        ``addressing_style`` ("path" or "virtual") overrides boto3's choice; left None, the
        shared config file's ``s3 = addressing_style = ...`` still applies.
        """
        self.transfer = transfer or TransferSettings()
        if client is None:
            client = _make_client(
                endpoint_url=endpoint_url or resolve_endpoint(),
                region=region,
                max_attempts=max_attempts,
                pool=max(10, self.transfer.concurrency * 2 + 2),
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                addressing_style=addressing_style,
            )
        self.client = client

    @property
    def endpoint(self) -> str:
        return str(self.client.meta.endpoint_url)

    # ------------------------------------------------------------------ errors

    def _wrap(self, exc: BaseException, what: str) -> ObjectStoreError:
        """Turn a botocore error into ours; the message never carries credentials."""
        from botocore import exceptions as bexc  # noqa: PLC0415 - boto3 is optional

        code = error_code(exc)
        if isinstance(exc, bexc.NoCredentialsError | bexc.PartialCredentialsError):
            return ObjectStoreConfigError(
                f"{what}: no usable AWS credentials from boto3's chain (AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, web identity, instance metadata)"
            )
        if isinstance(exc, bexc.EndpointConnectionError | bexc.ConnectTimeoutError):
            return ObjectStoreError(f"{what}: cannot reach the S3 endpoint {self.endpoint}: {exc}")
        if code in _NOT_FOUND:
            return ObjectNotFoundError(f"{what}: not found")
        if code in _NO_BUCKET:
            return ObjectNotFoundError(f"{what}: the bucket does not exist at {self.endpoint}")
        return ObjectStoreError(f"{what}: {exc}")

    # ------------------------------------------------------------------ validation

    def check_access(self, location: S3Uri | str, *, write: bool = False) -> None:
        """Fail fast with ObjectStoreConfigError if ``location`` cannot be used.

        Lists the prefix (needs the bucket to exist and the credentials to be valid); with
        ``write`` also puts and deletes a small probe object, so read-only credentials are
        caught before training starts instead of at the first upload.
        """
        from botocore import exceptions as bexc  # noqa: PLC0415 - boto3 is optional

        uri = _as_uri(location, "location")
        action = "list"
        try:
            self.client.list_objects_v2(Bucket=uri.bucket, Prefix=uri.prefix, MaxKeys=1)
            if write:
                action = "write to"
                probe = uri.join(f".rtj-write-probe-{uuid.uuid4().hex}")
                self.client.put_object(Bucket=probe.bucket, Key=probe.key, Body=b"")
                self.client.delete_object(Bucket=probe.bucket, Key=probe.key)
        except (bexc.NoCredentialsError, bexc.PartialCredentialsError) as exc:
            raise self._wrap(exc, f"cannot use {uri}") from exc
        except (bexc.EndpointConnectionError, bexc.ConnectTimeoutError) as exc:
            raise ObjectStoreConfigError(
                f"cannot use {uri}: the S3 endpoint {self.endpoint} is unreachable ({exc}); "
                "check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / S3_ENDPOINT_URL"
            ) from exc
        except bexc.ClientError as exc:
            code = error_code(exc)
            if code in _NO_BUCKET or (code in _NOT_FOUND and not write):
                raise ObjectStoreConfigError(
                    f"cannot use {uri}: bucket {uri.bucket!r} does not exist at {self.endpoint}"
                ) from exc
            if code in _DENIED:
                raise ObjectStoreConfigError(
                    f"cannot use {uri}: access denied ({code}) trying to {action} it at "
                    f"{self.endpoint}; check the credentials boto3 found "
                    f"(source: {self._credential_source()}) and their permissions"
                ) from exc
            raise ObjectStoreConfigError(f"cannot use {uri} at {self.endpoint}: {exc}") from exc
        except bexc.BotoCoreError as exc:
            raise ObjectStoreConfigError(f"cannot use {uri} at {self.endpoint}: {exc}") from exc

    def _credential_source(self) -> str:
        """Where boto3 found credentials (e.g. "env", "shared-credentials-file"), never the keys."""
        try:
            creds = self.client._request_signer._credentials  # no public accessor
            return str(getattr(creds, "method", "unknown")) if creds else "none"
        except AttributeError:
            return "unknown"

    # ------------------------------------------------------------------ small objects

    def head(self, location: S3Uri | str) -> ObjectInfo | None:
        """The object's size, ETag and xxh3 metadata; None when it does not exist."""
        uri = _as_uri(location, "location")
        try:
            resp = self.client.head_object(Bucket=uri.bucket, Key=uri.key)
        except Exception as exc:
            err = self._wrap(exc, f"HEAD {uri}")
            if type(err) is ObjectNotFoundError and error_code(exc) not in _NO_BUCKET:
                return None
            raise err from exc
        meta = {k.lower(): v for k, v in (resp.get("Metadata") or {}).items()}
        modified = resp.get("LastModified")
        return ObjectInfo(
            uri=uri,
            size=int(resp["ContentLength"]),
            etag=str(resp.get("ETag", "")),
            xxh3=meta.get(META_XXH3),
            last_modified=modified.timestamp() if modified else 0.0,
            metadata=meta,
        )

    def put_bytes(
        self, location: S3Uri | str, data: bytes, *, content_type: str = "application/octet-stream"
    ) -> None:
        """One PUT; S3 makes it visible atomically (readers see the old or the new object)."""
        uri = _as_uri(location, "location")
        try:
            self.client.put_object(
                Bucket=uri.bucket,
                Key=uri.key,
                Body=data,
                ContentType=content_type,
                Metadata={META_XXH3: xxhash.xxh3_128(data).hexdigest()},
            )
        except Exception as exc:
            raise self._wrap(exc, f"PUT {uri}") from exc

    def get_bytes(self, location: S3Uri | str) -> bytes | None:
        """The whole object, or None when it does not exist."""
        uri = _as_uri(location, "location")
        try:
            resp = self.client.get_object(Bucket=uri.bucket, Key=uri.key)
            return resp["Body"].read()
        except Exception as exc:
            err = self._wrap(exc, f"GET {uri}")
            if type(err) is ObjectNotFoundError and error_code(exc) not in _NO_BUCKET:
                return None
            raise err from exc

    def put_json(self, location: S3Uri | str, value: Any) -> None:
        body = (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()
        self.put_bytes(location, body, content_type="application/json")

    def get_json(self, location: S3Uri | str) -> Any | None:
        """Parsed JSON, or None when absent; ValueError (from json) when it does not parse."""
        data = self.get_bytes(location)
        return None if data is None else json.loads(data)

    # ------------------------------------------------------------------ listing / deleting

    def list_objects(self, location: S3Uri | str) -> Iterator[ObjectInfo]:
        """Every object under the folder ``location`` (recursively), in key order."""
        uri = _as_uri(location, "location")
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=uri.bucket, Prefix=uri.prefix
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    modified = obj.get("LastModified")
                    yield ObjectInfo(
                        uri=S3Uri(uri.bucket, obj["Key"]),
                        size=int(obj["Size"]),
                        etag=str(obj.get("ETag", "")),
                        last_modified=modified.timestamp() if modified else 0.0,
                    )
        except ObjectStoreError:
            raise
        except Exception as exc:
            raise self._wrap(exc, f"LIST {uri}") from exc

    def list_folders(self, location: S3Uri | str) -> list[str]:
        """Names of the immediate sub-folders (common prefixes) of ``location``."""
        uri = _as_uri(location, "location")
        names: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=uri.bucket, Prefix=uri.prefix, Delimiter="/"
            )
            for page in pages:
                for cp in page.get("CommonPrefixes", []):
                    names.append(cp["Prefix"][len(uri.prefix) :].rstrip("/"))
        except Exception as exc:
            raise self._wrap(exc, f"LIST {uri}") from exc
        return names

    def delete(self, location: S3Uri | str) -> None:
        uri = _as_uri(location, "location")
        try:
            self.client.delete_object(Bucket=uri.bucket, Key=uri.key)
        except Exception as exc:
            raise self._wrap(exc, f"DELETE {uri}") from exc

    def delete_prefix(self, location: S3Uri | str, *, first: tuple[str, ...] = ()) -> int:
        """Delete every object under the folder ``location``; returns how many.

        Keys named in ``first`` (relative to the folder, e.g. ``manifest.json``) go before the
        rest, so a reader never sees a manifest whose data is already gone.
        """
        uri = _as_uri(location, "location")
        for rel in first:
            self.delete(uri.join(rel))
        keys = [o.uri.key for o in self.list_objects(uri)]
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            try:
                objects = [{"Key": k} for k in batch]
                resp = self.client.delete_objects(
                    Bucket=uri.bucket, Delete={"Objects": objects, "Quiet": True}
                )
                failed = resp.get("Errors") or []
            except Exception:  # some S3-compatible stores lack DeleteObjects: one by one
                failed = [{"Key": k} for k in batch]
            for err in failed:
                self.delete(S3Uri(uri.bucket, err["Key"]))
        return len(keys) + len(first)

    # ------------------------------------------------------------------ upload

    def upload_file(
        self,
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
        uri = _as_uri(location, "location")
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise LocalDataError(f"cannot read {path} to upload it: {exc}") from exc
        try:
            actual = os.fstat(fd).st_size
            if size is not None and actual != size:
                raise LocalDataError(f"{path} has {actual} bytes, the manifest says {size}")
            if xxh3 is None:
                hasher = RangeHasher(fd)
                hasher.advance_to(actual)
                xxh3 = hasher.hexdigest()
            if actual <= self.transfer.multipart_threshold:
                self._put_small(fd, actual, uri, xxh3, path)
            else:
                self._put_multipart(fd, actual, uri, xxh3, path=path, stop=stop)
        finally:
            os.close(fd)
        return ObjectInfo(uri=uri, size=actual, xxh3=xxh3)

    def _put_small(
        self, fd: int, size: int, uri: S3Uri, xxh3: str, path: str | os.PathLike[str]
    ) -> None:
        data = os.pread(fd, size, 0)
        if len(data) != size or xxhash.xxh3_128(data).hexdigest() != xxh3:
            raise LocalDataError(f"{path} does not match its manifest checksum; not uploading")
        try:
            self.client.put_object(
                Bucket=uri.bucket, Key=uri.key, Body=data, Metadata={META_XXH3: xxh3}
            )
        except Exception as exc:
            raise self._wrap(exc, f"PUT {uri}") from exc

    def _put_multipart(
        self,
        fd: int,
        size: int,
        uri: S3Uri,
        xxh3: str,
        *,
        path: str | os.PathLike[str],
        stop: threading.Event | None,
    ) -> None:
        part = self.transfer.part_size_for(size)
        try:
            upload_id = self.client.create_multipart_upload(
                Bucket=uri.bucket, Key=uri.key, Metadata={META_XXH3: xxh3}
            )["UploadId"]
        except Exception as exc:
            raise self._wrap(exc, f"PUT {uri} (create multipart upload)") from exc
        cancel = threading.Event()

        def send(number: int, offset: int, length: int) -> dict[str, Any]:
            if cancel.is_set() or (stop is not None and stop.is_set()):
                raise ObjectStoreError(f"PUT {uri}: cancelled")
            body = os.pread(fd, length, offset)
            if len(body) != length:
                raise LocalDataError(f"{path} shrank while being uploaded")
            resp = self.client.upload_part(
                Bucket=uri.bucket, Key=uri.key, UploadId=upload_id, PartNumber=number, Body=body
            )
            done = {"PartNumber": number, "ETag": resp["ETag"]}
            done.update(
                {k: v for k, v in resp.items() if k.startswith("Checksum") and k != "ChecksumType"}
            )
            return done

        ranges = [(i + 1, off, min(part, size - off)) for i, off in enumerate(range(0, size, part))]
        pool = ThreadPoolExecutor(self.transfer.concurrency, thread_name_prefix="rtj-s3-put")
        futures: list[Future[dict[str, Any]]] = [pool.submit(send, *r) for r in ranges]
        try:
            # Hash the local file while the parts are in flight; xxhash releases the GIL.
            hasher = RangeHasher(fd)
            hasher.advance_to(size)
            if hasher.hexdigest() != xxh3:
                raise LocalDataError(f"{path} does not match its manifest checksum; not uploading")
            parts = [f.result() for f in futures]
            self.client.complete_multipart_upload(
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
                self.client.abort_multipart_upload(
                    Bucket=uri.bucket, Key=uri.key, UploadId=upload_id
                )
            if isinstance(exc, ObjectStoreError | KeyboardInterrupt | SystemExit):
                raise
            raise self._wrap(exc, f"PUT {uri} (multipart)") from exc
        pool.shutdown(wait=True)

    # ------------------------------------------------------------------ download

    def download_file(
        self,
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
        ObjectNotFoundError when the object is gone, ObjectStoreError otherwise).
        """
        uri = _as_uri(location, "location")
        info: ObjectInfo | None = None
        if size is None or size == 0:
            info = self.head(uri)
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
                except OSError:
                    os.ftruncate(fd, size)
            digest = self._fetch_into(fd, uri, size, guard, stop)
            expected = xxh3 or guard.xxh3
            if expected and digest != expected:
                raise ChecksumMismatchError(
                    f"{uri}: downloaded bytes fail their checksum (got {digest}, expected "
                    f"{expected})"
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
        self,
        fd: int,
        uri: S3Uri,
        size: int,
        guard: _ReplyGuard,
        stop: threading.Event | None,
    ) -> str:
        """Write the object's ``size`` bytes into ``fd``; returns their xxh3-128 digest."""
        part = self.transfer.part_size_for(size)
        if size <= self.transfer.multipart_threshold:
            part = max(size, 1)
        cancel = threading.Event()

        def fetch(offset: int, length: int) -> None:
            if cancel.is_set() or (stop is not None and stop.is_set()):
                raise ObjectStoreError(f"GET {uri}: cancelled")
            args: dict[str, Any] = {"Bucket": uri.bucket, "Key": uri.key}
            if guard.etag:
                args["IfMatch"] = guard.etag  # the object must not change under us
            ranged = length != size
            if ranged:
                args["Range"] = f"bytes={offset}-{offset + length - 1}"
            try:
                resp = self.client.get_object(**args)
                guard.check(resp, ranged=ranged)
                body = resp["Body"]
                pos, end = offset, offset + length
                while pos < end:
                    if cancel.is_set():
                        raise ObjectStoreError(f"GET {uri}: cancelled")
                    chunk = body.read(min(_READ_CHUNK, end - pos))
                    if not chunk:
                        raise ObjectStoreError(f"GET {uri}: connection ended at byte {pos}")
                    view = memoryview(chunk)
                    while view:
                        n = os.pwrite(fd, view, pos)
                        view = view[n:]
                        pos += n
                body.close()
            except ObjectStoreError:
                raise
            except Exception as exc:
                if error_code(exc) in ("InvalidRange", "416"):
                    raise ChecksumMismatchError(f"{uri} is shorter than {size} bytes") from exc
                if error_code(exc) in ("PreconditionFailed", "412"):
                    raise ObjectStoreError(f"GET {uri}: the object changed mid-download") from exc
                raise self._wrap(exc, f"GET {uri}") from exc

        hasher = RangeHasher(fd)
        if size == 0:
            return hasher.hexdigest()
        ranges = [(off, min(part, size - off)) for off in range(0, size, part)]
        if len(ranges) == 1:
            fetch(*ranges[0])
            hasher.advance_to(size)
            return hasher.hexdigest()
        pool = ThreadPoolExecutor(self.transfer.concurrency, thread_name_prefix="rtj-s3-get")
        futures = [pool.submit(fetch, *r) for r in ranges]
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


def open_store(
    location: S3Uri | str, *, arg: str = "location", write: bool = True, **kwargs: Any
) -> tuple[S3Store, S3Uri]:
    """Parse ``location``, build a store and check access: call it at construction time.

    Raises ValueError for a malformed URI and ObjectStoreConfigError for a missing bucket,
    denied or missing credentials, or an unreachable endpoint, before any training happens.
    ``kwargs`` go to ``S3Store`` (endpoint_url, region, transfer, max_attempts, ...).
    """
    uri = _as_uri(location, arg)
    store = S3Store(**kwargs)
    store.check_access(uri, write=write)
    return store, uri


def _as_uri(location: S3Uri | str, arg: str) -> S3Uri:
    return location if isinstance(location, S3Uri) else parse_s3_uri(location, arg=arg)


def _make_client(
    *,
    endpoint_url: str | None,
    region: str | None,
    max_attempts: int,
    pool: int,
    connect_timeout: float,
    read_timeout: float,
    addressing_style: str | None,
) -> BaseClient:
    try:
        import boto3  # noqa: PLC0415 - optional dependency, imported on first use
        import botocore.session  # noqa: PLC0415
        from botocore.config import Config  # noqa: PLC0415
        from botocore.exceptions import ProfileNotFound  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ObjectStoreConfigError(
            "s3:// locations need boto3: pip install 'resumable-training[s3]'"
        ) from exc
    core = botocore.session.get_session()
    config = Config(
        retries={"mode": "standard", "max_attempts": max_attempts},
        max_pool_connections=pool,
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        tcp_keepalive=True,
        user_agent_extra="rtj-trainer-runtime",
    )
    # botocore's own CRC32 on every request and reply (its default since boto3 1.36) is
    # redundant here: every byte is checked end to end against the manifest's xxh3 (local bytes
    # before an upload completes, downloaded bytes before they are renamed into place), and the
    # wire is covered by TLS or, over plain http, by SigV4 payload signing. Skipping it saves
    # CPU on the transfer path and is what GCS and OCI need (they reject those headers). A
    # setting from the environment or the profile still wins.
    try:
        scoped = core.get_scoped_config()
    except ProfileNotFound:
        scoped = {}
    for key in ("request_checksum_calculation", "response_checksum_validation"):
        if not os.environ.get(f"AWS_{key.upper()}") and key not in scoped:
            config = config.merge(Config(**{key: "when_required"}))
    if addressing_style:
        config = config.merge(Config(s3={"addressing_style": addressing_style}))
    session = boto3.session.Session(botocore_session=core)
    return session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
