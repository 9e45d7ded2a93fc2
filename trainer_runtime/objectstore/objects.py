"""The object store's vocabulary, below ``store.py``: objects, transfer settings, the store.

``ObjectInfo`` (what a HEAD or a listing says), ``TransferSettings`` (part size, streams), the
metadata key that carries an object's digest, and ``Store``: the part of ``store.S3Store`` the
modules it calls use (``transfers.py``, ``access.py``), so that none of them imports
``store.py`` and the store's methods can call them. ``store.py`` re-exports every name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from ..run import arguments
from .errors import ObjectStoreError
from .uri import S3Uri, parse_s3_uri

if TYPE_CHECKING:
    from botocore.client import BaseClient

META_XXH3 = "xxh3-128"
"""User-metadata key (``x-amz-meta-xxh3-128``) holding the object's xxh3-128 hex digest."""

MiB = 1 << 20
MIN_PART_SIZE = 5 * MiB  # S3's smallest part (every part of a multipart upload but the last)
_MAX_PARTS = 10_000  # S3's limit on parts of one multipart upload


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

    def __post_init__(self) -> None:
        """Refuse what no transfer could use: a part under S3's 5 MiB minimum (it was raised
        to 5 MiB without a word), no stream at all (every multipart transfer then failed, and
        uploads retried forever), a negative threshold."""
        arguments.integer(
            "TransferSettings.part_size",
            self.part_size,
            f"bytes >= {MIN_PART_SIZE} (5 MiB, S3's smallest part)",
            lambda n: n >= MIN_PART_SIZE,
        )
        arguments.integer(
            "TransferSettings.concurrency", self.concurrency, "a count >= 1", lambda n: n >= 1
        )
        arguments.integer(
            "TransferSettings.multipart_threshold",
            self.multipart_threshold,
            "bytes >= 0",
            lambda n: n >= 0,
        )

    def part_size_for(self, size: int) -> int:
        part = self.part_size
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


def as_uri(location: S3Uri | str, arg: str) -> S3Uri:
    return location if isinstance(location, S3Uri) else parse_s3_uri(location, arg=arg)


class Store(Protocol):
    """What the transfers and the access check use of a store; ``store.S3Store`` is the one.

    Typed here so that ``transfers.py`` and ``access.py``, which ``S3Store``'s methods call,
    need not import ``store.py`` back."""

    client: BaseClient
    probe_client: BaseClient | None
    transfer: TransferSettings

    @property
    def endpoint(self) -> str: ...

    def wrap_error(self, exc: BaseException, what: str) -> ObjectStoreError: ...

    def credential_source(self) -> str: ...

    def head(self, location: S3Uri | str) -> ObjectInfo | None: ...
