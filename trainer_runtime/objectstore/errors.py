"""Exceptions of the object-store layer, split by what the caller should do about them.

``ObjectStoreConfigError`` is raised at construction (bad URI, missing bucket, denied or missing
credentials, unreachable endpoint): the user must fix the configuration, so training must not
start. It is also a ``trainer_runtime.errors.ConfigError`` (what ``CheckpointManager`` raises
for every other bad setting), so ``except ConfigError`` and ``except ObjectStoreConfigError``
both catch it. ``LocalDataError`` means the local copy cannot be uploaded as it is (missing or
corrupt file): retrying cannot help. Everything else that is an ``ObjectStoreError`` is worth
retrying.
"""

from __future__ import annotations

from ..errors import ConfigError


class ObjectStoreError(RuntimeError):
    """Base class; a plain instance is a transient failure worth retrying."""


class ObjectStoreConfigError(ObjectStoreError, ConfigError):
    """The configuration is wrong (bucket, credentials, endpoint): fail before training starts.

    A ``ConfigError`` (and so a ``ValueError``) as well as an ``ObjectStoreError``."""


class ObjectNotFoundError(ObjectStoreError):
    """The object (or bucket) asked for does not exist."""


class ChecksumMismatchError(ObjectStoreError):
    """Bytes do not match the size or xxh3-128 digest the manifest promises."""


class LocalDataError(ObjectStoreError):
    """A local file to upload is missing or does not match its manifest entry: not retryable."""


class NoValidCheckpointError(ObjectStoreError):
    """No remote checkpoint of the run verified (each candidate's reason is in the message)."""


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: a store error that is not about configuration, missing or bad data."""
    return isinstance(exc, ObjectStoreError) and not isinstance(
        exc,
        ObjectStoreConfigError | ObjectNotFoundError | ChecksumMismatchError | LocalDataError,
    )


# S3 error codes (botocore ``ClientError``), by what they mean to the caller.
NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound", "NoSuchUpload"}
NO_BUCKET_CODES = {"NoSuchBucket"}
DENIED_CODES = {
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
