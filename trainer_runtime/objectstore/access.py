"""The access check an ``s3://`` run makes before training starts.

A run that cannot list, read or write its bucket should fail at construction, naming the
permission that is missing, not an hour later at its first upload or resume. The check does
what training will do, on a small scale: list the prefix, read an object that is not there (a
404 means the credentials may read; a 403 means they may not, which listing alone does not
show) and, for a run that writes, put and delete a probe object. It uses the store's probe
client, whose timeouts are short, so a store that takes connections but never answers fails
the check in seconds. (Rejected: ``head_bucket``, which needs a permission of its own and says
nothing about objects.)
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from .errors import (
    DENIED_CODES,
    NO_BUCKET_CODES,
    NOT_FOUND_CODES,
    ObjectStoreConfigError,
    error_code,
)
from .objects import Store
from .uri import S3Uri

if TYPE_CHECKING:
    from botocore.client import BaseClient

log = logging.getLogger("trainer_runtime.objectstore.store")


def check_access(store: Store, uri: S3Uri, *, write: bool = False, arg: str | None = None) -> None:
    """Fail fast with ObjectStoreConfigError if ``location`` cannot be used.

    Lists the prefix (needs the bucket to exist and the credentials to be valid) and reads
    an object that is not there (a 404, not a 403: the credentials may read objects, which
    listing alone does not show); with ``write`` also puts and deletes a small probe object,
    so read-only or write-only credentials are caught before training starts instead of at
    the first resume or upload. ``arg`` names the user's argument or variable the location
    came from (``folder``, ``RTJ_CHECKPOINT_DIR``, the CLI's ``FOLDER``) in every message.
    """
    from botocore import exceptions as bexc  # noqa: PLC0415 - boto3 is optional

    action = "list"
    client = store.probe_client or store.client
    where = f"{uri} ({arg})" if arg else str(uri)
    log.info("object store: checking access to %s at %s", uri, store.endpoint)
    try:
        client.list_objects_v2(Bucket=uri.bucket, Prefix=uri.prefix, MaxKeys=1)
        action = "read objects in"
        _probe_read(client, uri.join(f".rtj-read-probe-{uuid.uuid4().hex}"))
        if write:
            action = "write to"
            probe = uri.join(f".rtj-write-probe-{uuid.uuid4().hex}")
            client.put_object(Bucket=probe.bucket, Key=probe.key, Body=b"")
            action = "delete objects in"
            client.delete_object(Bucket=probe.bucket, Key=probe.key)
    except (bexc.NoCredentialsError, bexc.PartialCredentialsError) as exc:
        raise store.wrap_error(exc, f"cannot use {where}") from exc
    except (bexc.EndpointConnectionError, bexc.ConnectTimeoutError) as exc:
        raise ObjectStoreConfigError(
            f"cannot use {where}: the S3 endpoint {store.endpoint} is unreachable ({exc}); "
            "check AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL / S3_ENDPOINT_URL"
            f"{_credentials(store)}"
        ) from exc
    except bexc.ClientError as exc:
        code = error_code(exc)
        if code in NO_BUCKET_CODES or (code in NOT_FOUND_CODES and not write):
            raise ObjectStoreConfigError(
                f"cannot use {where}: bucket {uri.bucket!r} does not exist at {store.endpoint}"
                f"{_credentials(store)}"
            ) from exc
        if code in DENIED_CODES:
            raise ObjectStoreConfigError(
                f"cannot use {where}: access denied ({code}) trying to {action} it at "
                f"{store.endpoint}; check the credentials boto3 found "
                f"(source: {store.credential_source()}) and their permissions"
            ) from exc
        raise ObjectStoreConfigError(
            f"cannot use {where} at {store.endpoint}: {exc}{_credentials(store)}"
        ) from exc
    except bexc.BotoCoreError as exc:
        raise ObjectStoreConfigError(
            f"cannot use {where} at {store.endpoint}: {exc}{_credentials(store)}"
        ) from exc


def _credentials(store: Store) -> str:
    """Where boto3 found the credentials it used (never the keys), for every refusal."""
    return f" (credentials boto3 found: source {store.credential_source()})"


def _probe_read(client: BaseClient, absent: S3Uri) -> None:
    """HEAD a key that does not exist: "not found" is the answer readable credentials get."""
    from botocore import exceptions as bexc  # noqa: PLC0415 - boto3 is optional

    try:
        client.head_object(Bucket=absent.bucket, Key=absent.key)
    except bexc.ClientError as exc:
        if error_code(exc) not in NOT_FOUND_CODES:
            raise
