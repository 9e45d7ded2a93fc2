"""S3Store against the real local server: verified transfers and construction-time errors."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.objectstore.conftest import SMALL_PARTS, point_env_at
from tests.objectstore.helpers import require_minio, scoped_credentials
from tools.s3server import S3Server, free_port
from trainer_runtime.errors import ConfigError
from trainer_runtime.objectstore import (
    ChecksumMismatchError,
    LocalDataError,
    ObjectStoreConfigError,
    ObjectStoreError,
    S3Backend,
    S3Store,
    S3Uri,
    open_store,
    resolve_endpoint,
)
from trainer_runtime.objectstore.checksum import file_xxh3


def _write(path: Path, size: int) -> str:
    path.write_bytes(os.urandom(size))
    return file_xxh3(path)


@pytest.mark.parametrize("size", [0, 1000, 17 << 20])  # empty, one PUT, 4 parallel parts
def test_roundtrip_verified(store: S3Store, s3_root: S3Uri, tmp_path: Path, size: int) -> None:
    src = tmp_path / "src.bin"
    digest = _write(src, size)
    remote = s3_root.join("ckpt", "rank0.pt")
    store.upload_file(src, remote, size=size, xxh3=digest)
    info = store.head(remote)
    assert info is not None and info.size == size and info.xxh3 == digest
    if size > SMALL_PARTS.multipart_threshold:
        assert info.etag.strip('"').endswith("-4")  # really a 4-part multipart upload
    dest = tmp_path / "out" / "rank0.pt"
    dest.parent.mkdir()
    store.download_file(remote, dest, size=size, xxh3=digest)
    assert file_xxh3(dest) == digest
    assert sorted(p.name for p in dest.parent.iterdir()) == ["rank0.pt"]  # no temp left


def test_upload_refuses_local_file_that_does_not_match(
    store: S3Store, s3_root: S3Uri, tmp_path: Path
) -> None:
    src = tmp_path / "src.bin"
    digest = _write(src, 12 << 20)
    with open(src, "r+b") as f:  # bit rot after the manifest was written
        f.seek(7 << 20)
        f.write(b"\xff" * 16)
    remote = s3_root.join("rank0.pt")
    with pytest.raises(LocalDataError, match="checksum"):
        store.upload_file(src, remote, size=12 << 20, xxh3=digest)
    assert store.head(remote) is None  # the multipart upload was aborted, not completed
    with pytest.raises(LocalDataError, match="bytes"):
        store.upload_file(src, remote, size=5, xxh3=digest)
    with pytest.raises(LocalDataError, match="cannot read"):
        store.upload_file(tmp_path / "missing", remote)


def test_download_rejects_corrupt_object_and_leaves_nothing(
    store: S3Store, s3_env: S3Server, s3_root: S3Uri, tmp_path: Path
) -> None:
    src = tmp_path / "src.bin"
    digest = _write(src, 13 << 20)
    remote = s3_root.join("rank0.pt")
    store.upload_file(src, remote, xxh3=digest)
    # Same size, same checksum metadata, different bytes: only the download can tell.
    s3_env.client().put_object(
        Bucket=remote.bucket,
        Key=remote.key,
        Body=os.urandom(13 << 20),
        Metadata={"xxh3-128": digest},
    )
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ChecksumMismatchError, match="fail their checksum"):
        store.download_file(remote, out / "rank0.pt", size=13 << 20, xxh3=digest)
    assert list(out.iterdir()) == []
    with pytest.raises(ChecksumMismatchError, match="bytes"):
        store.download_file(remote, out / "rank0.pt", size=12, xxh3=digest)


def test_small_objects_listing_and_delete(store: S3Store, s3_root: S3Uri) -> None:
    store.put_json(s3_root.join("run", "latest.json"), {"checkpoint": "a"})
    assert store.get_json(s3_root.join("run", "latest.json")) == {"checkpoint": "a"}
    assert store.get_json(s3_root.join("run", "nothing.json")) is None
    for name in ("a", "b"):
        store.put_bytes(s3_root.join("run", name, "manifest.json"), b"{}")
        store.put_bytes(s3_root.join("run", name, "rank0.pt"), b"x")
    assert sorted(store.list_folders(s3_root.join("run"))) == ["a", "b"]
    assert store.delete_prefix(s3_root.join("run", "a"), first=("manifest.json",)) >= 2
    assert sorted(store.list_folders(s3_root.join("run"))) == ["b"]
    assert [o.uri.name for o in store.list_objects(s3_root.join("run", "b"))] == [
        "manifest.json",
        "rank0.pt",
    ]


def test_check_access_ok_and_missing_bucket(s3_env: S3Server, s3_root: S3Uri) -> None:
    store, uri = open_store(str(s3_root), arg="save_folder")
    assert uri == s3_root
    assert list(store.list_objects(s3_root)) == []  # the write probe was cleaned up
    with pytest.raises(ObjectStoreConfigError, match=r"bucket 'no-such-bucket' does not exist"):
        open_store("s3://no-such-bucket/x")
    with pytest.raises(ValueError, match=r"save_folder.*s3://BUCKET/PREFIX"):
        open_store("s3:/bucket", arg="save_folder")


def test_check_access_bad_credentials(
    s3_env: S3Server,
    s3_root: S3Uri,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    if s3_env.kind == "moto":
        # moto accepts any key unless IAM auth is switched on; then, after the one action that
        # creates the bucket, every request must be signed by a key moto's IAM knows: none is.
        with S3Server(
            tmp_path / "auth", kind="moto", backend_env={"INITIAL_NO_AUTH_ACTION_COUNT": "1"}
        ) as strict:
            point_env_at(strict, monkeypatch)
            with pytest.raises(ObjectStoreConfigError, match=r"access denied \(InvalidAccessKeyId"):
                open_store(f"s3://{strict.bucket}/x")
        return
    secret = "definitely-wrong-secret-123"  # noqa: S105 - a test value
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    with pytest.raises(ObjectStoreConfigError, match="access denied") as info:
        open_store(str(s3_root))
    assert "SignatureDoesNotMatch" in str(info.value) and "source: env" in str(info.value)
    assert secret not in str(info.value) and secret not in caplog.text
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "unknown-key-id")
    with pytest.raises(ObjectStoreConfigError, match="InvalidAccessKeyId"):
        open_store(str(s3_root))


def test_check_access_unreachable_endpoint(
    s3_env: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", url)
    with pytest.raises(ObjectStoreConfigError, match="unreachable") as info:
        open_store("s3://rtj-test/x", max_attempts=2, connect_timeout=1)
    assert url in str(info.value)


def test_endpoint_resolution(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_endpoint({"S3_ENDPOINT_URL": "http://a"}) == "http://a"
    assert resolve_endpoint({"S3_ENDPOINT_URL": "http://a", "AWS_ENDPOINT_URL": "http://b"}) is None
    assert resolve_endpoint({}) is None
    # Composer's variable alone reaches the server ...
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.setenv("S3_ENDPOINT_URL", s3_env.url)
    assert S3Store().endpoint == s3_env.url
    S3Store().check_access(S3Uri(s3_env.bucket))
    # ... and boto3's own variables win over it.
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env.url)
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:1")
    assert S3Store().endpoint == s3_env.url


def test_botocore_checksums_off_unless_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    config = S3Store(endpoint_url="http://127.0.0.1:9").client.meta.config
    assert config.request_checksum_calculation == "when_required"
    assert config.response_checksum_validation == "when_required"
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_supported")
    config = S3Store(endpoint_url="http://127.0.0.1:9").client.meta.config
    assert config.request_checksum_calculation == "when_supported"  # the user's choice wins


def test_one_request_makes_five_attempts_in_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/object-store.md: "5 attempts per request", the first try included."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "rtj-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "rtj-test")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every attempt is refused
    store = S3Store(endpoint_url=url, region="us-east-1", connect_timeout=0.5)
    sent: list[object] = []
    store.client.meta.events.register("before-send.s3.*", lambda **kw: sent.append(kw["request"]))
    with pytest.raises(ObjectStoreError, match="cannot reach"):
        store.head(S3Uri("rtj-test", "x"))
    assert len(sent) == 5, sent


def test_region_from_aws_region(s3_env: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/object-store.md: the region is `AWS_REGION` / `AWS_DEFAULT_REGION` / the profile.
    botocore itself reads only AWS_DEFAULT_REGION; AWS_REGION alone must still sign for it."""
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    store = S3Store()
    assert store.client.meta.region_name == "eu-central-1"
    scopes: list[str] = []
    store.client.meta.events.register(
        "before-send.s3.*", lambda **kw: scopes.append(kw["request"].headers["Authorization"])
    )
    store.head(S3Uri(s3_env.bucket, "absent"))  # a real, signed request to the server
    assert scopes and all(b"/eu-central-1/s3/aws4_request" in s for s in scopes), scopes
    # AWS_REGION wins over AWS_DEFAULT_REGION, as in the AWS CLI; an explicit region over both.
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert S3Store().client.meta.region_name == "eu-central-1"
    assert S3Store(region="ap-south-1").client.meta.region_name == "ap-south-1"
    monkeypatch.delenv("AWS_REGION")
    assert S3Store().client.meta.region_name == "us-west-2"
    # Without a custom endpoint the region also picks AWS's regional endpoint.
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    assert S3Store().endpoint == "https://s3.eu-central-1.amazonaws.com"


def test_check_access_names_the_permission_the_credentials_lack(
    s3_env: S3Server, s3_root: S3Uri, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/object-store.md: denied credentials fail at construction. Credentials that may list
    and write but not read (a policy without s3:GetObject) passed the probe, then every resume
    failed after a minute of retries and every upload stayed pending (the pointer is read before
    it moves); credentials that may not delete were reported as unable to write."""
    require_minio(s3_env)
    write_only = ["s3:ListBucket", "s3:PutObject", "s3:DeleteObject"]
    for name, value in scoped_credentials(s3_env, write_only).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ObjectStoreConfigError, match=r"access denied \(403\) trying to read"):
        open_store(str(s3_root))
    with pytest.raises(ObjectStoreConfigError, match=r"trying to read objects in"):
        open_store(str(s3_root), write=False)  # what rtj-checkpoints does

    no_delete = ["s3:ListBucket", "s3:GetObject", "s3:PutObject"]
    for name, value in scoped_credentials(s3_env, no_delete).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ObjectStoreConfigError, match=r"trying to delete objects in"):
        open_store(str(s3_root.join("a")))

    read_only = ["s3:ListBucket", "s3:GetObject"]
    for name, value in scoped_credentials(s3_env, read_only).items():
        monkeypatch.setenv(name, value)
    open_store(str(s3_root), write=False)  # enough to look
    with pytest.raises(ObjectStoreConfigError, match=r"AccessDenied\) trying to write to"):
        open_store(str(s3_root))

    for name, value in scoped_credentials(s3_env, [*no_delete, "s3:DeleteObject"]).items():
        monkeypatch.setenv(name, value)
    open_store(str(s3_root.join("b")))  # every permission training needs


def test_a_bad_addressing_style_names_the_argument_and_the_choices(
    s3_env: S3Server, s3_root: S3Uri
) -> None:
    """docs/object-store.md (OCI): ``addressing_style="path"`` to ``S3Backend``/``S3Store``.
    A misspelt value is a ValueError naming the argument, before any request."""
    for build in (
        lambda: S3Store(addressing_style="Path"),
        lambda: S3Backend(s3_root, "run", addressing_style="pth"),
    ):
        with pytest.raises(
            ValueError, match=r"addressing_style='(Path|pth)'.*'path', 'virtual', 'auto'"
        ):
            build()
    backend = S3Backend(s3_root, "run", addressing_style="path")
    assert backend.store.list_folders(s3_root) == []
    backend.close(1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"flush_timeout_s": -1}, "flush_timeout_s=-1: expected seconds >= 0"),
        ({"flush_timeout_s": float("nan")}, "flush_timeout_s=nan: expected seconds >= 0"),
        ({"flush_timeout_s": "5"}, "flush_timeout_s='5': expected seconds >= 0"),
        ({"peer_timeout_s": -1.5}, "peer_timeout_s=-1.5: expected seconds > 0"),
        ({"peer_timeout_s": float("nan")}, "peer_timeout_s=nan: expected seconds > 0"),
        ({"resume_attempts": 0}, "resume_attempts=0: expected a count >= 1"),
        ({"connect_timeout": -1}, "connect_timeout=-1: expected seconds > 0"),
        ({"read_timeout": float("nan")}, "read_timeout=nan: expected seconds > 0"),
        ({"read_timeout": float("inf")}, "read_timeout=inf: expected seconds > 0"),
        ({"max_attempts": 0}, "max_attempts=0: expected a count >= 1"),
        ({"keep_local": -1}, "keep_local=-1: expected None or a count >= 0"),
        ({"keep_local": 1.5}, "keep_local=1.5: expected an int, None or a count >= 0"),
        ({"keep_remote": 0}, "keep_remote=0: expected -1 (keep all) or a count >= 1"),
    ],
)
def test_negative_or_nan_timeouts_are_refused_naming_the_argument(
    s3_env: S3Server, s3_root: S3Uri, kwargs: dict, message: str
) -> None:
    """S3Backend(flush_timeout_s=-1) was accepted (close() then did not wait at all), and so
    were NaN and negative peer and socket timeouts: a ConfigError names the argument now."""
    with pytest.raises(ConfigError) as caught:
        S3Backend(s3_root, "run", **kwargs)
    assert message in str(caught.value)
    assert not isinstance(caught.value, ObjectStoreConfigError)  # refused before any request
