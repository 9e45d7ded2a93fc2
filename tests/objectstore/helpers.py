"""Builders shared by the objectstore tests and their subprocess scripts."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from trainer_runtime.save import atomic
from trainer_runtime.save.manifest import MANIFEST_NAME, FileEntry, Manifest, hash_file
from trainer_runtime.timestamp import Timestamp

if TYPE_CHECKING:
    from tools.s3server import S3Server

RUN = "run"


def make_checkpoint(
    run_dir: Path,
    name: str,
    batch: int,
    *,
    world_size: int = 1,
    size: int = 256 << 10,
    run_name: str = RUN,
) -> tuple[Path, Manifest]:
    """A committed local checkpoint of random bytes: rank files, then the manifest, last."""
    folder = run_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for rank in range(world_size):
        path = folder / f"rank{rank}.pt"
        with open(path, "wb") as f:
            f.write(os.urandom(size + rank))
        got_size, digest = hash_file(path)
        files.append(FileEntry(path=path.name, rank=rank, size=got_size, xxh3_128=digest))
    manifest = Manifest(
        name=name,
        run_name=run_name,
        world_size=world_size,
        timestamp=Timestamp(epoch=0, batch=batch, sample=batch * 8),
        files=files,
        created_at=datetime.now(UTC).isoformat(),
    )
    atomic.write_bytes_atomic(folder / MANIFEST_NAME, manifest.to_json().encode())
    return folder, manifest


def require_minio(server: S3Server) -> None:
    """Skip a test that needs MinIO's per-action policies on another server; under CI=true,
    where ``make test`` builds MinIO, fail instead."""
    if server.kind == "minio":
        return
    reason = f"needs a server that enforces per-action policies (MinIO), not {server.kind}"
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def scoped_credentials(server: S3Server, actions: list[str]) -> dict[str, str]:
    """Temporary credentials allowed only ``actions`` on the test bucket (MinIO's STS
    AssumeRole with a session policy: the server enforces it like an IAM policy)."""
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": actions,
                "Resource": [f"arn:aws:s3:::{server.bucket}", f"arn:aws:s3:::{server.bucket}/*"],
            }
        ],
    }
    import boto3  # only the tests that use it need boto3

    env = server.env()
    sts = boto3.session.Session().client(
        "sts",
        endpoint_url=server.url,
        region_name=env["AWS_DEFAULT_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )
    creds = sts.assume_role(
        RoleArn="arn:minio:iam:::role/rtj-test",
        RoleSessionName="rtj-test",
        Policy=json.dumps(policy),
        DurationSeconds=900,
    )["Credentials"]
    return {
        "AWS_ACCESS_KEY_ID": creds["AccessKeyId"],
        "AWS_SECRET_ACCESS_KEY": creds["SecretAccessKey"],
        "AWS_SESSION_TOKEN": creds["SessionToken"],
    }
