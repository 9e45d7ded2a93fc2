"""``rtj-checkpoints ls|verify|export`` on an ``s3://`` run folder, as a real process against the
suite's S3 server, configured only by the environment training uses (docs/object-store.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer_runtime import CheckpointManager

from ..unit.trainkit import make, saved_weights, step
from .helpers import require_minio, scoped_credentials

pytestmark = pytest.mark.objectstore

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "trainer_runtime.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


def save_two(tmp_path: Path, run_uri: str) -> Path:
    """ep0-ba1 and ep0-ba2 in the bucket; returns the local run folder that saved them."""
    model, opt, sched, _ = make()
    ck = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=run_uri,
        local_folder=tmp_path / "local",
        run_name="run",
        interval="1ba",
    )
    for _ in range(2):
        step(model, opt, sched)
        ck.batch_end(4)
    ck.close()
    return tmp_path / "local"


def damage(client, bucket: str, key: str) -> None:
    """Other bytes, same size and digest metadata: only a byte-level check sees it."""
    head = client.head_object(Bucket=bucket, Key=key)
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body), Metadata=head["Metadata"])


def test_ls_verify_and_export_take_an_s3_run_folder(tmp_path, s3_env, s3_root):
    run_uri = str(s3_root.join("run"))
    local = save_two(tmp_path, run_uri)

    listed = cli("ls", run_uri)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].startswith("* ep0-ba2") and lines[1].startswith("  ep0-ba1"), listed.stdout

    assert cli("verify", run_uri).returncode == 0
    damage(s3_env.client(), s3_root.bucket, f"{s3_root.key}/run/ep0-ba2/__0_0.distcp")
    verified = cli("verify", run_uri)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    ba2, ba1 = verified.stdout.splitlines()
    assert ba2.startswith("* ep0-ba2") and "BROKEN" in ba2 and "__0_0.distcp" in ba2
    assert ba1.startswith("  ep0-ba1") and ba1.endswith(" ok")

    # The run folder's newest that downloads intact (ep0-ba1), and a named checkpoint.
    out = tmp_path / "weights.pt"
    exported = cli("export", run_uri, str(out))
    assert exported.returncode == 0, exported.stderr
    assert f"{run_uri}/ep0-ba1" in exported.stdout
    expected = saved_weights(local / "ep0-ba1")
    got = torch.load(out, weights_only=True)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)
    named = cli("export", f"{run_uri}/ep0-ba2", str(out))
    assert named.returncode == 1 and "ep0-ba2" in named.stderr, named.stderr


def test_a_bad_s3_location_names_the_argument_and_keeps_the_uri(s3_env):
    bad = cli("ls", "s3://Not_A_Bucket/x")
    assert bad.returncode == 2
    assert "FOLDER='s3://Not_A_Bucket/x'" in bad.stderr and "s3:/N" not in bad.stderr
    assert "folder=" not in bad.stderr  # the CLI's argument (its usage line), not the API's
    assert "FOLDER" in cli("ls", "--help").stdout
    missing = cli("verify", "s3://no-such-bucket-rtj/run")
    assert missing.returncode == 2 and "no-such-bucket-rtj" in missing.stderr, missing.stderr


def test_a_refused_s3_location_names_the_argument(tmp_path, s3_env, s3_root, monkeypatch):
    """docs/object-store.md (Command line): a bad location exits 2 naming the command's
    argument, for a missing bucket and refused credentials too, not only a malformed URI."""
    missing = cli("ls", "s3://no-such-bucket-rtj/run")
    assert missing.returncode == 2, missing.stderr
    assert "s3://no-such-bucket-rtj/run (FOLDER): bucket 'no-such-bucket-rtj' does not" in (
        missing.stderr
    )
    require_minio(s3_env)  # moto accepts any secret
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    run_uri = str(s3_root.join("run"))
    refused = cli("verify", run_uri)
    assert refused.returncode == 2 and refused.stdout == "", refused.stdout
    assert f"cannot use {run_uri} (FOLDER): access denied (SignatureDoesNotMatch)" in (
        refused.stderr
    ), refused.stderr
    assert "not-the-secret" not in refused.stderr and "Traceback" not in refused.stderr


def test_credentials_that_may_list_but_not_read_exit_2(tmp_path, s3_env, s3_root, monkeypatch):
    """ "A bad location exits 2 with the same errors as training": credentials without
    s3:GetObject are refused at the access check, not reported as a store failure midway."""
    require_minio(s3_env)
    run_uri = str(s3_root.join("run"))
    save_two(tmp_path, run_uri)
    for name, value in scoped_credentials(s3_env, ["s3:ListBucket"]).items():
        monkeypatch.setenv(name, value)
    for args in (("ls", run_uri), ("verify", run_uri), ("export", run_uri, str(tmp_path / "w.pt"))):
        denied = cli(*args)
        assert denied.returncode == 2, (args, denied.stdout, denied.stderr)
        assert "access denied (403) trying to read objects in" in denied.stderr, denied.stderr
        assert "source: env" in denied.stderr and "Traceback" not in denied.stderr


def test_a_prefix_that_holds_nothing_is_not_a_folder(tmp_path, s3_env, s3_root):
    """A typo in the run folder: locally "is not a folder" and exit 2; in a bucket ls and
    verify printed nothing and exited 0, so a check gated on verify passed on nothing."""
    run_uri = str(s3_root.join("run"))
    save_two(tmp_path, run_uri)
    missing = tmp_path / "no-such-run"
    for typo in (str(s3_root.join("rnu")), str(missing)):
        for args in (("ls", typo), ("verify", typo), ("export", typo, str(tmp_path / "w.pt"))):
            got = cli(*args)
            assert got.returncode == 2, (args, got.stdout, got.stderr)
            assert f"{typo} is not a folder" in got.stderr and got.stdout == "", got.stderr
    assert cli("verify", run_uri + "/").returncode == 0  # with a trailing slash too


def test_export_refuses_an_out_it_cannot_write(tmp_path, s3_env, s3_root):
    """OUT is "the .pt file to write". An s3:// OUT was written, without a word, to a local
    ./s3:/BUCKET/... ; a folder, or a path under a file, failed with a traceback after the
    checkpoint had been downloaded."""
    run_uri = str(s3_root.join("run"))
    local = save_two(tmp_path, run_uri)
    work = tmp_path / "cwd"
    work.mkdir()
    for source in (run_uri, str(local)):
        to_bucket = cli("export", source, str(s3_root.join("weights.pt")), cwd=work)
        assert to_bucket.returncode == 2, to_bucket.stdout + to_bucket.stderr
        assert "export writes a local file" in to_bucket.stderr and to_bucket.stdout == ""
        assert list(work.iterdir()) == []  # no ./s3:/ folder

        folder = cli("export", source, str(work))
        assert folder.returncode == 2 and f"OUT={str(work)!r} is a folder" in folder.stderr
        assert "Traceback" not in folder.stderr

        (tmp_path / "a-file").write_text("x")
        for under in (tmp_path / "a-file" / "w.pt", tmp_path / "a-file" / "sub" / "w.pt"):
            got = cli("export", source, str(under))
            assert got.returncode == 2, got.stdout + got.stderr
            assert f"OUT={str(under)!r}: {tmp_path / 'a-file'} is a file" in got.stderr
            assert got.stdout == "" and len(got.stderr.splitlines()) == 1, got.stderr
        assert (tmp_path / "a-file").read_text() == "x"


def test_an_out_under_a_file_is_refused_before_the_store_is_asked(tmp_path, s3_env, monkeypatch):
    """A path under a regular file was found unwritable only after the whole checkpoint had
    been downloaded (exit 1). Now it is refused first: with the endpoint unreachable, the
    error is still about OUT, not the store."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{port}")
    (tmp_path / "file.txt").write_text("x")
    out = tmp_path / "file.txt" / "x"
    got = cli("export", f"s3://{s3_env.bucket}/run", str(out))
    assert got.returncode == 2, got.stdout + got.stderr
    assert got.stderr == (
        f"rtj-checkpoints: OUT={str(out)!r}: {tmp_path / 'file.txt'} is a file, not a folder; "
        "give a path whose folders are folders (or do not exist yet)\n"
    )


def test_ls_and_verify_of_a_checkpoint_folder_show_that_checkpoint(tmp_path, s3_env, s3_root):
    """Given a checkpoint instead of its run folder, ls and verify printed nothing and exited 0
    (a run folder with no checkpoint in it): now they list and check that checkpoint alone."""
    run_uri = str(s3_root.join("run"))
    local = save_two(tmp_path, run_uri)
    for folder in (f"{run_uri}/ep0-ba1", str(local / "ep0-ba1")):
        listed = cli("ls", folder)
        assert listed.returncode == 0, listed.stderr
        assert [line.split()[0] for line in listed.stdout.splitlines()] == ["ep0-ba1"], listed
        verified = cli("verify", folder)
        assert verified.returncode == 0 and verified.stdout.rstrip().endswith(" ok"), verified
    damage(s3_env.client(), s3_root.bucket, f"{s3_root.key}/run/ep0-ba1/__0_0.distcp")
    broken = cli("verify", f"{run_uri}/ep0-ba1")
    assert broken.returncode == 1 and "BROKEN" in broken.stdout, broken.stdout + broken.stderr
    assert "ep0-ba2" not in broken.stdout


def test_verify_of_an_s3_checkpoint_without_a_manifest_fails(tmp_path, s3_env, s3_root):
    """Read as a run folder, a checkpoint whose manifest is not in the bucket printed nothing
    and verify exited 0, as for a checkpoint that verifies."""
    run_uri = str(s3_root.join("run"))
    save_two(tmp_path, run_uri)
    s3_env.client().delete_object(
        Bucket=s3_root.bucket, Key=f"{s3_root.key}/run/ep0-ba2/manifest.json"
    )
    verified = cli("verify", f"{run_uri}/ep0-ba2")
    assert verified.returncode == 1, verified.stdout + verified.stderr
    (line,) = verified.stdout.splitlines()
    assert line.split()[:3] == ["ep0-ba2", "NOT", "COMMITTED"], line
    listed = cli("ls", f"{run_uri}/ep0-ba2")
    assert listed.returncode == 0 and "NOT COMMITTED" in listed.stdout, listed
    assert cli("verify", f"{run_uri}/ep0-ba1").returncode == 0


def test_verify_of_an_s3_run_folder_fails_on_a_manifest_that_does_not_parse(
    tmp_path, s3_env, s3_root
):
    """As locally: a manifest object that does not parse is a broken checkpoint (exit 1),
    where one that is missing is a checkpoint not committed (exit 0)."""
    run_uri = str(s3_root.join("run"))
    save_two(tmp_path, run_uri)
    key = f"{s3_root.key}/run/ep0-ba1/manifest.json"
    s3_env.client().put_object(Bucket=s3_root.bucket, Key=key, Body=b"[1, 2")
    verified = cli("verify", run_uri)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    (line,) = [x for x in verified.stdout.splitlines() if "ep0-ba1" in x]
    assert line.split()[1] == "BROKEN:", verified.stdout
    s3_env.client().delete_object(Bucket=s3_root.bucket, Key=key)
    verified = cli("verify", run_uri)
    assert verified.returncode == 0 and "NOT COMMITTED" in verified.stdout, verified.stdout


def test_every_subcommand_exits_quietly_when_its_reader_closes_the_pipe(tmp_path, s3_env, s3_root):
    """``rtj-checkpoints ls RUN | head -1``: the reader goes away before the output is written
    (here: before the tool starts). No traceback, exit status 141 (128 + SIGPIPE), local and
    ``s3://`` alike; ``export`` still writes its file."""
    run_uri = str(s3_root.join("run"))
    local = save_two(tmp_path, run_uri)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    for folder in (str(local), run_uri):
        for i, args in enumerate((["ls"], ["verify"], ["export"])):
            out = [str(tmp_path / f"weights-{i}-{folder.startswith('s3')}.pt")] if i == 2 else []
            read_end, write_end = os.pipe()
            os.close(read_end)  # the reader is gone before anything is written
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "trainer_runtime.cli", *args, folder, *out],
                    env=env,
                    stdout=write_end,
                    stderr=subprocess.PIPE,
                    text=True,
                    timeout=120,
                    check=False,
                )
            finally:
                os.close(write_end)
            assert proc.returncode == 141, (args, folder, proc.stderr)
            assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
            if out:
                weights = saved_weights(local / "ep0-ba2")
                assert torch.load(out[0], weights_only=True).keys() == weights.keys()


def test_a_folder_of_the_users_in_an_s3_run_folder_is_no_checkpoint(tmp_path, s3_env, s3_root):
    """As for a local run folder (docs/runtime.md, Command line): ``tb_logs/`` beside the
    checkpoints is not listed as NOT COMMITTED; checkpoint files without a manifest (a save or
    prune cut short) still are."""
    run_uri = str(s3_root.join("run"))
    local = save_two(tmp_path, run_uri)
    client, prefix = s3_env.client(), f"{s3_root.key}/run"
    client.put_object(Bucket=s3_root.bucket, Key=f"{prefix}/tb_logs/events.out.1", Body=b"x")
    client.put_object(Bucket=s3_root.bucket, Key=f"{prefix}/notes/readme.txt", Body=b"x")
    client.delete_object(Bucket=s3_root.bucket, Key=f"{prefix}/ep0-ba1/manifest.json")
    (local / "tb_logs").mkdir()
    (local / "tb_logs" / "events.out.1").write_bytes(b"x")
    (local / "ep0-ba1" / "manifest.json").unlink()
    for folder in (str(local), run_uri):
        for cmd in ("ls", "verify"):
            done = cli(cmd, folder)
            assert done.returncode == 0, (cmd, folder, done.stdout, done.stderr)
            names = [line[2:].split()[0] for line in done.stdout.splitlines()]
            assert names == ["ep0-ba2", "ep0-ba1"], (cmd, folder, done.stdout)
            assert "NOT COMMITTED" in done.stdout.splitlines()[1], (cmd, folder, done.stdout)
