"""A real S3 HTTP server on 127.0.0.1 for the objectstore tests, the benchmark and the local stack.

Two back ends, chosen by ``RTJ_S3_SERVER`` (``minio``, ``moto`` or ``auto``, the default):

- **MinIO**, built from source by ``hack/s3/build-minio.sh`` into the user's cache. Preferred:
  it persists to disk (SIGKILL and restart keeps every object), enforces real SigV4 auth (so a
  wrong secret is rejected) and is a faithful S3.
- **moto** in server mode (``python -m moto.server``), always installable from PyPI. It keeps its
  state in memory, so ``kill()`` cannot kill moto itself without losing the data; instead the
  client talks to moto through a small TCP proxy *process* on the public port, and ``kill()``
  SIGKILLs that process (open connections reset mid-request, new ones refused), ``restart()``
  starts a new one on the same port. From the client's side that is a server dying and coming
  back; what it does not exercise is the store's own crash recovery.

Run ``python tools/s3server.py serve`` to start one by hand (prints its env), or
``python tools/s3server.py proxy LISTEN_PORT TARGET_PORT`` (internal: the proxy).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from tools.ports import free_port

REPO = Path(__file__).resolve().parents[1]
MINIO_VERSION_FILE = REPO / "hack" / "s3" / "MINIO_VERSION"
ACCESS_KEY = "rtj-test-access-key"
SECRET_KEY = "rtj-test-secret-key-not-secret"  # noqa: S105 - a local test server's key
REGION = "us-east-1"


class ServerUnavailableError(RuntimeError):
    """No S3 server could be started (neither MinIO built nor moto installed)."""


def minio_binary() -> Path | None:
    """The pinned MinIO build, if ``hack/s3/build-minio.sh`` has made it (or RTJ_MINIO_BIN)."""
    explicit = os.environ.get("RTJ_MINIO_BIN")
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    version = MINIO_VERSION_FILE.read_text().strip()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = cache / "rtj" / "bin" / f"minio-{version}" / "minio"
    return path if path.is_file() else None


def moto_available() -> bool:
    try:
        import moto.server  # noqa: F401, PLC0415 - probed: moto is optional
    except ImportError:
        return False
    return True


def _wait_port(port: int, deadline: float, proc: subprocess.Popen[bytes] | None) -> None:
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerUnavailableError(f"server process exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise ServerUnavailableError(f"nothing listening on 127.0.0.1:{port} in time")


def _wait_http(url: str, deadline: float, proc: subprocess.Popen[bytes] | None) -> None:
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ServerUnavailableError(f"server process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:  # noqa: S310 - fixed local URL
                if resp.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
            last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise ServerUnavailableError(f"{url} not healthy in time: {last}")


class S3Server:
    """One S3 server process (plus, for moto, its proxy) on a fixed 127.0.0.1 port."""

    def __init__(
        self,
        workdir: Path | None = None,
        *,
        kind: str | None = None,
        bucket: str = "rtj-test",
        backend_env: dict[str, str] | None = None,
    ) -> None:
        """``backend_env`` adds environment for the server process (e.g. moto's auth switch)."""
        kind = (kind or os.environ.get("RTJ_S3_SERVER") or "auto").lower()
        if kind == "auto":
            kind = "minio" if minio_binary() else "moto"
        if kind == "minio" and minio_binary() is None:
            raise ServerUnavailableError("MinIO is not built: run hack/s3/build-minio.sh")
        if kind == "moto" and not moto_available():
            raise ServerUnavailableError("moto is not installed: pip install 'moto[server]'")
        if kind not in ("minio", "moto"):
            raise ValueError(f"RTJ_S3_SERVER={kind!r}: expected minio, moto or auto")
        self.kind = kind
        self.bucket = bucket
        self.backend_env = dict(backend_env or {})
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="rtj-s3-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._backend_port = free_port() if kind == "moto" else self.port
        self._backend: subprocess.Popen[bytes] | None = None
        self._proxy: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """Environment that points boto3 (in this or a child process) at this server only."""
        return {
            "AWS_ENDPOINT_URL_S3": self.url,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> S3Server:
        deadline = time.monotonic() + timeout
        atexit.register(self.stop)  # never leave a server behind, even if a test run aborts
        self._start_backend(deadline)
        if self.kind == "moto":
            self._start_proxy(deadline)
        self.create_bucket(self.bucket)
        return self

    def _log(self, name: str) -> int:
        return os.open(self.workdir / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _start_backend(self, deadline: float) -> None:
        log = self._log(self.kind)
        try:
            if self.kind == "minio":
                env = {
                    **os.environ,
                    "MINIO_ROOT_USER": ACCESS_KEY,
                    "MINIO_ROOT_PASSWORD": SECRET_KEY,
                    "MINIO_BROWSER": "off",
                    "MINIO_UPDATE": "off",
                    "MINIO_CI_CD": "1",
                    **self.backend_env,
                }
                data = self.workdir / "data"
                data.mkdir(parents=True, exist_ok=True)
                argv = [
                    str(minio_binary()),
                    "server",
                    "--quiet",
                    "--address",
                    f"127.0.0.1:{self.port}",
                    "--console-address",
                    f"127.0.0.1:{free_port()}",
                    str(data),
                ]
                health = f"{self.url}/minio/health/ready"
            else:
                env = {**os.environ, **self.backend_env}
                argv = [
                    sys.executable,
                    "-m",
                    "moto.server",
                    "-H",
                    "127.0.0.1",
                    "-p",
                    str(self._backend_port),
                ]
                health = f"http://127.0.0.1:{self._backend_port}/moto-api/"
            self._backend = subprocess.Popen(
                argv, stdout=log, stderr=log, env=env, start_new_session=True
            )
        finally:
            os.close(log)
        _wait_http(health, deadline, self._backend)

    def _start_proxy(self, deadline: float) -> None:
        log = self._log("proxy")
        try:
            self._proxy = subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "proxy",
                    str(self.port),
                    str(self._backend_port),
                ],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            os.close(log)
        _wait_port(self.port, deadline, self._proxy)

    def kill(self) -> None:
        """SIGKILL what the client talks to (MinIO itself; moto's proxy). Data survives."""
        proc = self._backend if self.kind == "minio" else self._proxy
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def pause(self) -> None:
        """SIGSTOP what the client talks to: connections are accepted by the kernel but never
        answered, the way a hung store looks from a client. ``unpause`` continues it."""
        self._signal_frontend(signal.SIGSTOP)

    def unpause(self) -> None:
        self._signal_frontend(signal.SIGCONT)

    def _signal_frontend(self, sig: int) -> None:
        proc = self._backend if self.kind == "minio" else self._proxy
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def restart(self, timeout: float = 60.0) -> None:
        """Start it again on the same port (after ``kill``); waits until it is healthy."""
        self.kill()
        deadline = time.monotonic() + timeout
        if self.kind == "minio":
            self._start_backend(deadline)
        else:
            self._start_proxy(deadline)

    def stop(self) -> None:
        atexit.unregister(self.stop)
        for proc in (self._proxy, self._backend):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ helpers

    def client(self, **overrides: str):
        """A plain boto3 client for this server (tests use it to inspect or damage objects)."""
        import boto3  # noqa: PLC0415 - only the tests that inspect objects need it
        from botocore.config import Config  # noqa: PLC0415

        env = {**self.env(), **overrides}
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.url,
            region_name=REGION,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            config=Config(retries={"mode": "standard", "max_attempts": 3}),
        )

    def create_bucket(self, name: str) -> None:
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)


# ---------------------------------------------------------------------- the TCP proxy process


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def run_proxy(listen_port: int, target_port: int) -> None:
    """Forward 127.0.0.1:listen_port to 127.0.0.1:target_port until killed."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", listen_port))
    server.listen(128)
    while True:
        client, _ = server.accept()
        try:
            upstream = socket.create_connection(("127.0.0.1", target_port))
        except OSError:
            client.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def main(argv: list[str]) -> int:
    if argv[:1] == ["proxy"] and len(argv) == 3:
        run_proxy(int(argv[1]), int(argv[2]))
        return 0
    if argv[:1] == ["serve"]:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the server on SIGTERM too
        with S3Server(kind=argv[1] if len(argv) > 1 else None) as server:
            for key, value in server.env().items():
                print(f"export {key}={value}")
            print(
                f"# {server.kind} on {server.url}, bucket s3://{server.bucket}; Ctrl-C stops",
                flush=True,
            )
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
