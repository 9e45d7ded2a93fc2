"""The object store at the edges of a run: a SIGTERM while the store hangs, and a resume that
falls back past checkpoints the bucket also holds.

The trainer is the example job (examples/train_deterministic.py) in a real process, with an
``s3://`` folder on the test's own S3 server, which is SIGSTOPped to make it hang.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from torch import nn

from tests.conftest import require
from tests.multiproc.launch import Gang
from tools.s3server import S3Server
from tools.waiting import wait_for
from trainer_runtime import CheckpointManager
from trainer_runtime.objectstore import Backoff, ObjectStoreError, S3Store
from trainer_runtime.objectstore import backend as backend_module
from trainer_runtime.objectstore import store as store_module
from trainer_runtime.objectstore.folder import verify_remote
from trainer_runtime.objectstore.uri import S3Uri
from trainer_runtime.run_folder.layout import RunFolder
from trainer_runtime.save.manifest import Manifest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_deterministic.py"
GRACE = 20.0
HUNG_RESUME_WORKER = Path(__file__).with_name("hung_resume_worker.py")


def start_job(tmp: Path, root: S3Uri, *extra: str) -> subprocess.Popen[bytes]:
    log = open(tmp / "job.log", "ab")  # noqa: SIM115 - owned by the child
    env_extra = {
        "RTJ_LOCAL_CHECKPOINT_DIR": str(tmp / "staging"),
        "RTJ_GRACE_PERIOD_SECONDS": str(GRACE),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLE),
            "--folder",
            str(root),
            "--run-name",
            "hang",
            "--dataset-size",
            "64",
            "--batch-size",
            "4",
            "--workers",
            "0",
            "--interval",
            "3ba",
            *extra,
        ],
        env={**os.environ, **env_extra},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    return proc


def remote_pointer(server: S3Server, root: S3Uri) -> str | None:
    client = server.client()
    try:
        body = client.get_object(Bucket=root.bucket, Key=f"{root.key}/hang/latest.json")["Body"]
    except client.exceptions.NoSuchKey:
        return None
    return json.loads(body.read())["checkpoint"]


def wait_until(predicate, timeout: float, what: str, proc=None) -> None:
    """``tools.waiting.wait_for`` that stops early when ``proc`` exited."""

    def check() -> bool:
        if predicate():
            return True
        assert proc is None or proc.poll() is None, f"job exited while waiting for {what}"
        return False

    wait_for(what, check, timeout)


def test_sigterm_with_a_hung_store_exits_inside_the_grace_period(tmp_path, own_s3_server):
    server, root = own_s3_server, S3Uri(own_s3_server.bucket, "hung")
    staging = RunFolder(tmp_path / "staging" / "s3" / root.bucket / root.key / "hang")
    job = start_job(tmp_path, root, "--epochs", "100", "--step-sleep", "0.1")
    try:
        wait_until(lambda: remote_pointer(server, root) is not None, 180, "a first upload", job)
        server.pause()  # the store hangs: connections accepted, never answered
        wait_until(lambda: len(staging.committed()) >= 3, 120, "saves while the store hangs", job)
        t0 = time.monotonic()
        job.send_signal(signal.SIGTERM)
        code = job.wait(GRACE + 10)
        elapsed = time.monotonic() - t0
    finally:
        if job.poll() is None:
            job.kill()
        server.unpause()
    log = (tmp_path / "job.log").read_text()
    assert code == 143, log[-3000:]
    assert elapsed < GRACE, f"exited {elapsed:.1f}s after SIGTERM, grace period {GRACE:.0f}s"
    assert "emergency save" in log
    assert "the store is hung or unreachable" in log, log[-3000:]
    assert "0 failed attempt(s), last error: None)\n" not in log
    newest = staging.committed()[0]
    assert newest.name in log.split("emergency save", 1)[1].splitlines()[0]

    # The next attempt, with the store back: its start-up resubmission uploads the emergency
    # checkpoint first, and the bucket's latest.json names it.
    again = start_job(tmp_path, root, "--epochs", "0")
    assert again.wait(180) == 0, (tmp_path / "job.log").read_text()[-3000:]
    assert remote_pointer(server, root) == newest.name
    assert verify_remote(S3Store(), root.join("hang"), newest) is None


def test_a_sigterm_during_the_final_upload_flush_gets_the_grace_period_and_exits_143(
    tmp_path, own_s3_server
):
    """Training has ended and close() waits for uploads to a hung store (120 s by default)
    when SIGTERM comes: the signal is still handled, so the uploads keep the grace period and
    the process ends with 143 by its deadline (the watchdog says so), not at once by SIGTERM's
    default action with nothing logged."""
    server, root = own_s3_server, S3Uri(own_s3_server.bucket, "flush")
    staging = RunFolder(tmp_path / "staging" / "s3" / root.bucket / root.key / "hang")
    job = start_job(tmp_path, root, "--epochs", "1", "--step-sleep", "0.1")
    try:
        wait_until(lambda: remote_pointer(server, root) is not None, 180, "a first upload", job)
        server.pause()

        def final_save_committed() -> bool:
            newest = staging.committed()
            return bool(newest) and newest[0].timestamp.batch == 16

        wait_until(final_save_committed, 120, "the final save", job)
        job.send_signal(signal.SIGTERM)
        code = job.wait(GRACE + 10)
    finally:
        if job.poll() is None:
            job.kill()
        server.unpause()
    log = (tmp_path / "job.log").read_text()
    assert code == 143, log[-3000:]
    assert "after SIGTERM (grace period 20s): exiting now with 143" in log, log[-3000:]


def small_manager(tmp: Path, root: S3Uri, **kw) -> tuple[CheckpointManager, nn.Module, object]:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ck = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=f"{root}/{{run_name}}",
        run_name="rej",
        local_folder=tmp / "local",
        interval="2ba",
        **kw,
    )
    return ck, model, opt


def test_checkpoints_rejected_at_resume_are_uncommitted_in_the_bucket_too(
    tmp_path, s3_env, s3_root, monkeypatch
):
    ck, _, _ = small_manager(tmp_path, s3_root)
    for _ in range(6):
        ck.batch_end(1)
    ck.close()
    client = s3_env.client()
    prefix = f"{s3_root.key}/rej"

    def pointer() -> str:
        body = client.get_object(Bucket=s3_root.bucket, Key=f"{prefix}/latest.json")["Body"]
        return json.loads(body.read())["checkpoint"]

    assert pointer() == "ep0-ba6"
    monkeypatch.setenv("RTJ_QUARANTINED", "ep0-ba6,ep0-ba4")
    ck2, _, _ = small_manager(tmp_path, s3_root)
    assert ck2.resume().path.endswith("ep0-ba2")
    keys = {
        o["Key"].removeprefix(prefix + "/")
        for o in client.list_objects_v2(Bucket=s3_root.bucket, Prefix=prefix)["Contents"]
    }
    for name in ("ep0-ba6", "ep0-ba4"):
        assert f"{name}/manifest.json" not in keys  # uncommitted in the bucket
        assert f"rejected/{name}/manifest.json" in keys and f"rejected/{name}/reason.json" in keys
        assert (tmp_path / "local" / "rejected" / name / "REJECTED.txt").exists()
    assert pointer() == "ep0-ba2"  # never names an uncommitted checkpoint
    for _ in range(2):
        ck2.batch_end(1)  # saves ep0-ba4-a<pid>: nothing blocks it
    ck2.close()
    assert pointer().startswith("ep0-ba4")


def test_a_resume_against_a_hung_store_fails_in_bounded_time_and_loses_nothing(
    tmp_path, own_s3_server, monkeypatch
):
    """The store takes connections and never answers (SIGSTOP) while resume lists it: every
    request gives up after the short waits of ``S3Store.responsive`` (scaled down here), so
    resume raises the store's error after its retries instead of botocore's 5 x 60 s per
    request (35 minutes in all, while the other ranks wait); once the store is back, the
    next resume takes the checkpoint it holds."""
    root = S3Uri(own_s3_server.bucket, "hung-resume")
    ck, _, _ = small_manager(tmp_path / "first", root)
    for _ in range(2):
        ck.batch_end(1)
    ck.close()
    monkeypatch.setattr(store_module, "RESPONSIVE_READ_TIMEOUT_S", 0.5)
    monkeypatch.setattr(backend_module, "RESUME_BACKOFF", Backoff(initial=0.1, maximum=0.2))
    ck, _, _ = small_manager(tmp_path / "second", root)
    own_s3_server.pause()
    outcome: list[BaseException | None] = []

    def resume() -> None:
        try:
            ck.resume()
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)

    try:
        resuming = threading.Thread(target=resume, daemon=True)
        resuming.start()
        resuming.join(120)  # each of resume's requests gives up after 3 x 0.5 s here
        assert not resuming.is_alive(), "resume still waits for a store that never answers"
    finally:
        own_s3_server.unpause()
    assert isinstance(outcome[0], ObjectStoreError) and "Read timeout" in str(outcome[0])
    ck.close(save=False)
    ck, _, _ = small_manager(tmp_path / "third", root)
    assert ck.resume().path.endswith("ep0-ba2")
    ck.close(save=False)


def one_committed_checkpoint(root: S3Uri, local: Path) -> str:
    """Run ``gang`` under ``root`` commits one checkpoint (its name) and uploads it."""
    ck = CheckpointManager(
        model=nn.Linear(4, 2), folder=f"{root}/{{run_name}}", run_name="gang", local_folder=local
    )
    ck.batch_end(1)
    ck.close()
    return ck.saved[-1].name


def test_every_rank_gets_the_store_error_when_resume_meets_a_hung_store(tmp_path, own_s3_server):
    """Two ranks resume while the store hangs: rank 0's listing fails after its retries, and
    rank 1 raises the same store error at the same moment, not gloo's "Connection closed by
    peer" once rank 0's process has gone (nor nothing until the coordination timeout)."""
    root = S3Uri(own_s3_server.bucket, "hung-gang")
    one_committed_checkpoint(root, tmp_path / "first")
    out = tmp_path / "out"
    out.mkdir()
    gang = Gang(HUNG_RESUME_WORKER, [str(root), str(out)], 2, tmp_path / "logs")
    try:
        wait_for("both ranks built", lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 120)
        own_s3_server.pause()
        (out / "go").touch()
        codes = gang.wait(180)
    finally:
        gang.kill()
        own_s3_server.unpause()
    logs = "".join((tmp_path / "logs" / f"rank{r}.log").read_text()[-2000:] for r in (0, 1))
    assert codes == [0, 0], logs
    outcomes = [json.loads((out / f"outcome{r}.json").read_text()) for r in (0, 1)]
    assert [o["raised"] for o in outcomes] == ["ObjectStoreError", "ObjectStoreError"], outcomes
    assert all("Read timeout" in o["message"] for o in outcomes), outcomes


def test_one_ranks_full_disk_at_a_resume_download_fails_every_rank_at_once(tmp_path, own_s3_server):
    """Rank 1's staging disk is full while a 2-rank gang downloads the checkpoint it resumes:
    every rank raises NoCheckpointError naming the disk's error (LocalWriteError, "No space
    left on device"), without retrying the store for the disk's fault, and the bucket keeps
    the checkpoint."""
    require(os.geteuid() == 0, "mounting a tmpfs needs root")
    root = S3Uri(own_s3_server.bucket, "full-gang")
    saved = one_committed_checkpoint(root, tmp_path / "first")
    out, mnt = tmp_path / "out", tmp_path / "mnt"
    out.mkdir()
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs", str(mnt)], check=True)
    try:
        (out / "r1").symlink_to(mnt)
        gang = Gang(HUNG_RESUME_WORKER, [str(root), str(out)], 2, tmp_path / "logs")
        try:
            wait_for(
                "both ranks built", lambda: all((out / f"ready{r}").exists() for r in (0, 1)), 120
            )
            with open(mnt / "filler", "wb") as filler, contextlib.suppress(OSError):
                filler.write(b"x" * 65536)  # the one page there is: no room for any file
            (out / "go").touch()
            codes = gang.wait(180)
        finally:
            gang.kill()
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    logs = "".join((tmp_path / "logs" / f"rank{r}.log").read_text()[-2000:] for r in (0, 1))
    assert codes == [0, 0], logs
    outcomes = [json.loads((out / f"outcome{r}.json").read_text()) for r in (0, 1)]
    assert [o["raised"] for o in outcomes] == ["NoCheckpointError", "NoCheckpointError"]
    for o in outcomes:
        assert "LocalWriteError" in o["message"] and "No space left on device" in o["message"]
    assert "failed (attempt" not in logs  # the store is not retried for a full disk
    manifest = Manifest.from_json(S3Store().get_bytes(root.join("gang", saved, "manifest.json")))
    assert verify_remote(S3Store(), root.join("gang"), manifest) is None


def test_the_first_saves_check_of_a_hung_store_is_one_attempt_then_training_goes_on(
    tmp_path, own_s3_server, monkeypatch, caplog
):
    """A run's first save lists the bucket for newer checkpoints. With the store hung, that
    listing is tried once (each request bounded by ``S3Store.responsive``'s waits, scaled
    down here), logged, and the save goes on with the local folder's check alone, instead of
    holding the training loop for the listing's six attempts (3.8 minutes measured)."""
    monkeypatch.setattr(store_module, "RESPONSIVE_READ_TIMEOUT_S", 0.5)
    ck, _, _ = small_manager(tmp_path, S3Uri(own_s3_server.bucket, "first-save"))
    ck.resume()
    own_s3_server.pause()
    try:
        with caplog.at_level("INFO", logger="trainer_runtime"):
            ck.batch_end(1)
            ck.batch_end(1)  # interval 2ba: the first save
    finally:
        own_s3_server.unpause()
    assert [s.name for s in ck.saved] == ["ep0-ba2"]
    assert "cannot list the object store's checkpoints" in caplog.text
    assert "failed (attempt 1/" not in caplog.text, caplog.text
    ck.close()
