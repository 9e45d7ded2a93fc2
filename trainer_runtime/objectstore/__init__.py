"""Object-store sync for checkpoints: ``s3://bucket/prefix`` folders on S3 or S3-compatible stores.

Layers, each its own module: ``uri`` (what a valid location is), ``store`` (one boto3 client plus
verified parallel transfers), ``uploader`` (background upload in commit order: data, manifest,
pointer), ``folder`` (a bucket prefix as a ``layout.RunFolder``, the same model as a local run
folder), ``resolver`` (newest remote checkpoint that verifies, downloaded and checked).
boto3 is imported only when a store is built, so ``trainer_runtime`` imports without it.
See docs/object-store.md.
"""

from __future__ import annotations

from .backend import S3Backend
from .errors import (
    ChecksumMismatchError,
    LocalDataError,
    NoValidCheckpointError,
    ObjectNotFoundError,
    ObjectStoreConfigError,
    ObjectStoreError,
)
from .flush_report import UploadStats
from .folder import StorePrefix, remote_run_folder, verify_remote
from .remote_commit import prune_remote
from .resolver import (
    RemoteCheckpoint,
    download_checkpoint,
    fetch_load_path,
    find_remote_checkpoint,
    list_remote_checkpoints,
    remote_pointer,
    resume_from_remote,
)
from .retry import Backoff
from .store import (
    ObjectInfo,
    S3Store,
    TransferSettings,
    open_store,
    resolve_endpoint,
    resolve_region,
)
from .transfers import LocalWriteError
from .uploader import CheckpointUploader
from .uri import S3Uri, is_s3_uri, parse_s3_uri

__all__ = [
    "Backoff",
    "CheckpointUploader",
    "ChecksumMismatchError",
    "LocalDataError",
    "LocalWriteError",
    "NoValidCheckpointError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStoreConfigError",
    "ObjectStoreError",
    "RemoteCheckpoint",
    "S3Backend",
    "S3Store",
    "S3Uri",
    "StorePrefix",
    "TransferSettings",
    "UploadStats",
    "download_checkpoint",
    "fetch_load_path",
    "find_remote_checkpoint",
    "is_s3_uri",
    "list_remote_checkpoints",
    "open_store",
    "parse_s3_uri",
    "prune_remote",
    "remote_pointer",
    "remote_run_folder",
    "resolve_endpoint",
    "resolve_region",
    "resume_from_remote",
    "verify_remote",
]
