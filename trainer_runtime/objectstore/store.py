"""``S3Store``: the runtime's one door to an S3 (or S3-compatible) bucket.

One boto3 client, shared by every thread, with the runtime's error mapping (``errors.py``: what
the caller should do), small-object requests, listing, prefix deletes, and the verified file
transfers of ``transfers.py``.

Endpoint: boto3 reads ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` itself; when neither is set,
``S3_ENDPOINT_URL`` (Composer's spelling) is used. Region: ``AWS_REGION`` (which botocore does not
read, though the AWS CLI and most SDKs do), else boto3's ``AWS_DEFAULT_REGION`` or profile.
Credentials come only from boto3's chain and are never logged or stored. boto3 is imported
lazily so ``trainer_runtime`` works without it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import xxhash

from ..envvars import AWS_ENDPOINT_URL, AWS_ENDPOINT_URL_S3, AWS_REGION, S3_ENDPOINT_URL
from ..run import arguments
from .access import check_access
from .client_errors import CHECKSUM_SETTINGS, client_setting_error
from .errors import (
    NO_BUCKET_CODES,
    NOT_FOUND_CODES,
    ObjectNotFoundError,
    ObjectStoreConfigError,
    ObjectStoreError,
    error_code,
)
from .objects import (  # defined below this module (objects.py), importable from here too
    META_XXH3,
    MIN_PART_SIZE,  # noqa: F401
    MiB,  # noqa: F401
    ObjectInfo,
    TransferSettings,
    as_uri,
)
from .uri import S3Uri

if TYPE_CHECKING:
    from botocore.client import BaseClient

log = logging.getLogger(__name__)


def resolve_endpoint(environ: Mapping[str, str] | None = None) -> str | None:
    """The endpoint to pass to boto3: None when boto3 will find one itself (or use AWS)."""
    env = os.environ if environ is None else environ
    if env.get(AWS_ENDPOINT_URL_S3) or env.get(AWS_ENDPOINT_URL):
        return None  # boto3's own configuration; it also honours the shared config file
    return env.get(S3_ENDPOINT_URL) or None


def resolve_region(environ: Mapping[str, str] | None = None) -> str | None:
    """The region to pass to boto3: ``AWS_REGION``, which the AWS CLI and the other SDKs read
    before ``AWS_DEFAULT_REGION`` but botocore ignores; None lets boto3 use
    ``AWS_DEFAULT_REGION`` or the profile."""
    env = os.environ if environ is None else environ
    return env.get(AWS_REGION) or None


ADDRESSING_STYLES = (None, "path", "virtual", "auto")
"""The values of ``S3Store(addressing_style=...)``: botocore's, None leaving it to boto3."""

PROBE_READ_TIMEOUT_S = 10.0
PROBE_ATTEMPTS = 3
"""``check_access`` (at construction) waits at most this long for each reply, this many times:
a healthy store lists one key in milliseconds, a hung one holds the job for 30 s, not 5 min."""
RESPONSIVE_READ_TIMEOUT_S = PROBE_READ_TIMEOUT_S
RESPONSIVE_ATTEMPTS = PROBE_ATTEMPTS
"""The same bounds for the requests resume makes (``S3Store.responsive``): every rank waits
for rank 0's listing, so a hung store must fail it in seconds, not 5 x 60 s per request."""


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

        ``max_attempts`` is how many times botocore sends one request in all, the first try
        included (standard mode retries connection errors, 5xx and throttling); callers retry
        whole transfers on top of it.
        ``addressing_style`` ("path" or "virtual") overrides boto3's choice; left None, the
        shared config file's ``s3 = addressing_style = ...`` still applies. A timeout that is
        not a finite number of seconds > 0, or ``max_attempts`` < 1, is a ConfigError naming
        the argument.
        """
        _check_client_arguments(max_attempts, connect_timeout, read_timeout, addressing_style)
        self.transfer = transfer or TransferSettings()
        self.probe_client: BaseClient | None = client
        self._settings: dict[str, Any] | None = None
        self._responsive: S3Store | None = None
        if client is None:
            settings = {
                "endpoint_url": endpoint_url or resolve_endpoint(),
                "region": region or resolve_region(),
                "connect_timeout": connect_timeout,
                "addressing_style": addressing_style,
            }
            client = _make_client(
                **settings,
                max_attempts=max_attempts,
                pool=max(10, self.transfer.concurrency * 2 + 2),
                read_timeout=read_timeout,
            )
            # check_access answers within PROBE_READ_TIMEOUT_S * PROBE_ATTEMPTS when the
            # endpoint takes connections but never replies, not 5 x 60 s.
            self.probe_client = _make_client(
                **settings,
                max_attempts=min(max_attempts, PROBE_ATTEMPTS),
                pool=2,
                read_timeout=min(read_timeout, PROBE_READ_TIMEOUT_S),
            )
            self._settings = {
                **settings,
                "max_attempts": max_attempts,
                "read_timeout": read_timeout,
            }
        self.client = client

    def responsive(self) -> S3Store:
        """This store with short waits: at most ``RESPONSIVE_ATTEMPTS`` tries of
        ``RESPONSIVE_READ_TIMEOUT_S`` per request, for resume's listing and downloads (a store
        that takes connections but never answers fails each in 30 s instead of 5 min). Built
        once; the store itself when it was given a client."""
        if self._settings is None:
            return self
        if self._responsive is None:
            settings = self._settings
            self._responsive = S3Store(
                endpoint_url=settings["endpoint_url"],
                region=settings["region"],
                transfer=self.transfer,
                max_attempts=min(settings["max_attempts"], RESPONSIVE_ATTEMPTS),
                connect_timeout=settings["connect_timeout"],
                read_timeout=min(settings["read_timeout"], RESPONSIVE_READ_TIMEOUT_S),
                addressing_style=settings["addressing_style"],
            )
        return self._responsive

    @property
    def endpoint(self) -> str:
        return str(self.client.meta.endpoint_url)

    # ------------------------------------------------------------------ errors

    def wrap_error(self, exc: BaseException, what: str) -> ObjectStoreError:
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
        if code in NOT_FOUND_CODES:
            return ObjectNotFoundError(f"{what}: not found")
        if code in NO_BUCKET_CODES:
            return ObjectNotFoundError(f"{what}: the bucket does not exist at {self.endpoint}")
        return ObjectStoreError(f"{what}: {exc}")

    # ------------------------------------------------------------------ validation

    def check_access(
        self, location: S3Uri | str, *, write: bool = False, arg: str | None = None
    ) -> None:
        """Fail fast with ObjectStoreConfigError if ``location`` cannot be used: it is listed
        and read (and with ``write``, written and deleted) as training will (``access.py``).
        ``arg`` names where the location came from in the messages."""
        check_access(self, as_uri(location, arg or "location"), write=write, arg=arg)

    def credential_source(self) -> str:
        """Where boto3 found credentials (e.g. "env", "shared-credentials-file"), never the keys."""
        try:
            creds = self.client._request_signer._credentials  # no public accessor
            return str(getattr(creds, "method", "unknown")) if creds else "none"
        except AttributeError:
            return "unknown"

    # ------------------------------------------------------------------ small objects

    def head(self, location: S3Uri | str) -> ObjectInfo | None:
        """The object's size, ETag and xxh3 metadata; None when it does not exist."""
        uri = as_uri(location, "location")
        try:
            resp = self.client.head_object(Bucket=uri.bucket, Key=uri.key)
        except Exception as exc:
            err = self.wrap_error(exc, f"HEAD {uri}")
            if type(err) is ObjectNotFoundError and error_code(exc) not in NO_BUCKET_CODES:
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
        uri = as_uri(location, "location")
        try:
            self.client.put_object(
                Bucket=uri.bucket,
                Key=uri.key,
                Body=data,
                ContentType=content_type,
                Metadata={META_XXH3: xxhash.xxh3_128(data).hexdigest()},
            )
        except Exception as exc:
            raise self.wrap_error(exc, f"PUT {uri}") from exc

    def get_bytes(self, location: S3Uri | str) -> bytes | None:
        """The whole object, or None when it does not exist."""
        uri = as_uri(location, "location")
        try:
            resp = self.client.get_object(Bucket=uri.bucket, Key=uri.key)
            return resp["Body"].read()
        except Exception as exc:
            err = self.wrap_error(exc, f"GET {uri}")
            if type(err) is ObjectNotFoundError and error_code(exc) not in NO_BUCKET_CODES:
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
        uri = as_uri(location, "location")
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
            raise self.wrap_error(exc, f"LIST {uri}") from exc

    def list_folders(self, location: S3Uri | str) -> list[str]:
        """Names of the immediate sub-folders (common prefixes) of ``location``."""
        uri = as_uri(location, "location")
        names: list[str] = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=uri.bucket, Prefix=uri.prefix, Delimiter="/"
            )
            for page in pages:
                for cp in page.get("CommonPrefixes", []):
                    names.append(cp["Prefix"][len(uri.prefix) :].rstrip("/"))
        except Exception as exc:
            raise self.wrap_error(exc, f"LIST {uri}") from exc
        return names

    def delete(self, location: S3Uri | str) -> None:
        uri = as_uri(location, "location")
        try:
            self.client.delete_object(Bucket=uri.bucket, Key=uri.key)
        except Exception as exc:
            raise self.wrap_error(exc, f"DELETE {uri}") from exc

    def delete_prefix(self, location: S3Uri | str, *, first: tuple[str, ...] = ()) -> int:
        """Delete every object under the folder ``location``; returns how many.

        Keys named in ``first`` (relative to the folder, e.g. ``manifest.json``) go before the
        rest, so a reader never sees a manifest whose data is already gone.
        """
        uri = as_uri(location, "location")
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

    # ------------------------------------------------------------------ files

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
        (``transfers.upload_file``.)
        """
        from . import transfers  # noqa: PLC0415 - transfers imports this module

        return transfers.upload_file(self, path, location, size=size, xxh3=xxh3, stop=stop)

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

        On any failure nothing is left under ``dest`` (ChecksumMismatchError for bad bytes or
        size, ObjectNotFoundError when the object is gone, ObjectStoreError for other store
        failures, an OSError when the local disk cannot take the bytes).
        (``transfers.download_file``.)
        """
        from . import transfers  # noqa: PLC0415 - transfers imports this module

        return transfers.download_file(self, location, dest, size=size, xxh3=xxh3, stop=stop)


def _check_client_arguments(
    max_attempts: int, connect_timeout: float, read_timeout: float, addressing_style: str | None
) -> None:
    """``S3Store``'s client arguments: a ConfigError names a wrong count or timeout, a
    ValueError an unknown addressing style."""
    arguments.integer("max_attempts", max_attempts, "a count >= 1", lambda n: n >= 1)
    for name, value in (("connect_timeout", connect_timeout), ("read_timeout", read_timeout)):
        arguments.seconds(name, value, "seconds > 0, finite", lambda s: 0 < s < math.inf)
    if addressing_style not in ADDRESSING_STYLES:
        raise ValueError(
            f"addressing_style={addressing_style!r}: expected None (boto3's choice) or one "
            f"of {', '.join(repr(s) for s in ADDRESSING_STYLES if s)}"
        )


def open_store(
    location: S3Uri | str, *, arg: str = "location", write: bool = True, **kwargs: Any
) -> tuple[S3Store, S3Uri]:
    """Parse ``location``, build a store and check access: call it at construction time.

    Raises ValueError for a malformed URI and ObjectStoreConfigError for a missing bucket,
    denied or missing credentials, or an unreachable endpoint, before any training happens.
    ``kwargs`` go to ``S3Store`` (endpoint_url, region, transfer, max_attempts, ...).
    """
    uri = as_uri(location, arg)
    store = S3Store(**kwargs)
    store.check_access(uri, write=write, arg=None if arg == "location" else arg)
    return store, uri


_LOADER_LOCK = threading.Lock()
_SHARED: dict[str, Any] = {}
"""``loader``: the botocore data loader every client of this process shares (``_core_session``)."""


def _core_session() -> Any:
    """A new botocore session (so credentials and configuration are read afresh) over the
    process's one data loader: the S3 service model and the endpoint rules, JSON files that
    take a second or more to load on a busy machine, are loaded once per process, not once per
    client (a store builds two, and resume two more); and a process forked after ``warm_up``
    (the in-pod agent's workers) inherits them loaded."""
    import botocore.session  # noqa: PLC0415 - optional dependency, imported on first use

    core = botocore.session.get_session()
    with _LOADER_LOCK:
        loader = _SHARED.get("loader")
    if loader is not None:  # the first client's, kept once it was built (_keep_loader)
        core.register_component("data_loader", loader)
    return core


def _keep_loader(core: Any) -> None:
    """Share the loader of a session that built a client (its profile and paths resolved)."""
    with _LOADER_LOCK:
        if "loader" not in _SHARED:
            _SHARED["loader"] = core.get_component("data_loader")


def warm_up() -> float:
    """Import boto3 and load what an S3 client needs, without a request; the seconds it took.
    The in-pod agent calls it before it forks its workers (agent/__main__.py)."""
    began = time.perf_counter()
    _make_client(
        endpoint_url="http://127.0.0.1:1",  # never contacted: the client makes no request
        region="us-east-1",
        max_attempts=1,
        pool=1,
        connect_timeout=1.0,
        read_timeout=1.0,
        addressing_style=None,
    )
    return time.perf_counter() - began


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
        from botocore.config import Config  # noqa: PLC0415
        from botocore.exceptions import ProfileNotFound  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ObjectStoreConfigError(
            "s3:// locations need boto3: pip install 'resumable-training[s3]'"
        ) from exc
    core = _core_session()
    config = Config(
        retries={"mode": "standard", "total_max_attempts": max_attempts},  # first try included
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
    for key, variable in CHECKSUM_SETTINGS.items():
        if not os.environ.get(variable) and key not in scoped:
            config = config.merge(Config(**{key: "when_required"}))
    if addressing_style:
        config = config.merge(Config(s3={"addressing_style": addressing_style}))
    try:
        session = boto3.session.Session(botocore_session=core)
        client = session.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)
        _keep_loader(core)
        return client
    except Exception as exc:
        refused = client_setting_error(exc, endpoint_url=endpoint_url, region=region)
        if refused is None:
            raise
        raise refused from exc
