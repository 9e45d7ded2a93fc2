"""Fixtures for the objectstore tests: a real S3 server on 127.0.0.1 and checkpoint builders.

The session server is shared; tests that kill a server get their own (``own_s3_server``). Every
test gets a fresh prefix in the bucket, so tests never see each other's objects. Outside CI a
missing server skips these tests; with CI=true it fails them.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # tests/ is not a package; make ``tests.objectstore`` importable
    sys.path.insert(0, str(REPO))

from tests.objectstore.helpers import make_checkpoint  # noqa: E402
from tools.s3server import S3Server, ServerUnavailableError  # noqa: E402
from trainer_runtime.objectstore import S3Store, S3Uri, TransferSettings  # noqa: E402
from trainer_runtime.save.manifest import Manifest  # noqa: E402

# Small parts so that MB-sized test files still exercise parallel multipart and ranged GETs.
SMALL_PARTS = TransferSettings(part_size=5 << 20, concurrency=4, multipart_threshold=6 << 20)

_AWS_VARS = (
    "AWS_ENDPOINT_URL",
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "S3_ENDPOINT_URL",
    "AWS_DEFAULT_PROFILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.objectstore)


def start_server(workdir: Path) -> S3Server:
    try:
        return S3Server(workdir).start()
    except ServerUnavailableError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no S3 server for the objectstore tests in CI: {exc}")
        pytest.skip(f"no S3 server: {exc}")


def point_env_at(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = start_server(tmp_path_factory.mktemp("s3server"))
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The session server, with boto3's environment pointing at it for this test."""
    point_env_at(s3_server, monkeypatch)
    return s3_server


@pytest.fixture
def own_s3_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Server]:
    """A server of this test's own, free to be killed and restarted."""
    server = start_server(tmp_path / "s3server")
    point_env_at(server, monkeypatch)
    yield server
    server.stop()


def _root(server: S3Server) -> S3Uri:
    return S3Uri(server.bucket, f"t-{uuid.uuid4().hex[:12]}")


@pytest.fixture
def s3_root(s3_env: S3Server) -> S3Uri:
    """A fresh, empty prefix in the session server's bucket (the checkpoint root)."""
    return _root(s3_env)


@pytest.fixture
def store(s3_env: S3Server) -> S3Store:
    return S3Store(transfer=SMALL_PARTS, max_attempts=3)


@pytest.fixture
def checkpoint_factory(tmp_path: Path) -> Callable[..., tuple[Path, Manifest]]:
    """make(name, batch, world_size=1, size=...) -> (local checkpoint folder, manifest)."""
    run_dir = tmp_path / "local" / "run"

    def make(name: str, batch: int, **kwargs: int) -> tuple[Path, Manifest]:
        return make_checkpoint(run_dir, name, batch, **kwargs)

    return make
