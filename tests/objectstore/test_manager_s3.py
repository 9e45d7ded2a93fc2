"""The CheckpointManager with an s3:// folder, against the real S3 server the suite starts."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time

import pytest
import torch

from tools.ports import free_port
from trainer_runtime import (
    CheckpointManager,
    ConfigError,
    Manifest,
    NoCheckpointError,
    OverwriteError,
    envvars,
    events,
)
from trainer_runtime.objectstore import ObjectStoreConfigError, S3Store, remote_pointer
from trainer_runtime.objectstore import store as store_module
from trainer_runtime.run_folder.layout import RunFolder

from ..unit.trainkit import make, params, step

pytestmark = pytest.mark.objectstore


def manager(s3_root, local, comps, **kw):
    model, opt, sched, _ = comps
    return CheckpointManager(
        model=model,
        optimizer=opt,
        scheduler=sched,
        folder=f"{s3_root}/{{run_name}}",
        local_folder=local,
        run_name="s3run",
        interval="1ba",
        **kw,
    )


def saved_run(s3_root, local, *, batches: int):
    """``make()``'s components after ``batches`` steps, each saved and uploaded (run s3run)."""
    comps = make()
    ck = manager(s3_root, local, comps)
    for _ in range(batches):
        step(*comps[:3])
        ck.batch_end(4)
    ck.close()
    return comps


def test_saves_upload_and_a_fresh_disk_resumes_from_the_store(tmp_path, s3_root):
    comps = make()
    ck = manager(s3_root, tmp_path / "node-a", comps, num_local_checkpoints_to_keep=0)
    for _ in range(3):
        step(*comps[:3])
        ck.batch_end(4)
    ck.close()  # flushes the uploads
    store = S3Store()
    run_uri = s3_root.join("s3run")
    assert remote_pointer(store, run_uri) == "ep0-ba3"
    assert sorted(store.list_folders(run_uri)) == ["ep0-ba1", "ep0-ba2", "ep0-ba3"]
    assert not any((tmp_path / "node-a").glob("ep0-*/*.distcp")), "keep_local=0 keeps none"
    remote_files = {o.uri.name for o in store.list_objects(run_uri.join("ep0-ba3"))}
    assert {".metadata", "__0_0.distcp", "manifest.json"} <= remote_files

    # The node is gone: a new one with an empty disk resumes from the store.
    fresh = make(seed=9)
    ck2 = manager(s3_root, tmp_path / "node-b", fresh)
    res = ck2.resume()
    assert res.source == "remote" and ck2.timestamp.batch == 3
    assert all(torch.equal(a, b) for a, b in zip(params(fresh[0]), params(comps[0]), strict=True))
    assert Manifest.read(tmp_path / "node-b" / "ep0-ba3").timestamp.batch == 3
    ck2.close()


def test_keep_local_zero_deletes_the_checkpoints_the_bucket_holds_that_a_resume_left(
    tmp_path, s3_root
):
    """keep_local=0 keeps no local copy of a checkpoint the bucket holds: the one a resume
    downloaded goes like an uploaded one, once the next upload is done, and so do the ones an
    earlier attempt left on the disk."""
    saved_run(s3_root, tmp_path / "node-a", batches=2)  # default keep_local: both stay
    assert sorted(p.name for p in (tmp_path / "node-a").glob("ep0-*")) == ["ep0-ba1", "ep0-ba2"]
    # node-b: an empty disk downloads ep0-ba2; node-a: its disk is behind ep0-ba3 in the bucket.
    for disk, resumed_from in ((tmp_path / "node-b", "ep0-ba2"), (tmp_path / "node-a", "ep0-ba3")):
        comps = make(seed=4)
        ck = manager(s3_root, disk, comps, num_local_checkpoints_to_keep=0)
        res = ck.resume()
        assert res.source == "remote" and res.path.endswith(resumed_from), res
        step(*comps[:3])
        ck.batch_end(4)
        ck.close()
        assert sorted(p.name for p in disk.glob("ep0-*")) == [], disk
    store, run_uri = S3Store(), s3_root.join("s3run")
    assert remote_pointer(store, run_uri) == "ep0-ba4"
    assert sorted(store.list_folders(run_uri)) == ["ep0-ba1", "ep0-ba2", "ep0-ba3", "ep0-ba4"]


def test_keep_local_zero_leaves_no_local_copy_when_a_resumed_run_saves_nothing(tmp_path, s3_root):
    """A run that resumed from the bucket and ended without a save (nothing trained, or
    close(save=False)) kept the downloaded copy for good: it was to go at the next upload,
    and there was none. The bucket holds it committed, so close() deletes it."""
    saved_run(s3_root, tmp_path / "node-a", batches=2)
    shutil.rmtree(tmp_path / "node-a" / "ep0-ba1")  # the earlier attempt's disk: ep0-ba2 only
    for disk, close in (
        (tmp_path / "node-b", {}),  # an empty disk downloads ep0-ba2; nothing trained
        (tmp_path / "node-a", {"save": False}),  # resumed from the copy an earlier attempt left
    ):
        ck = manager(s3_root, disk, make(seed=4), num_local_checkpoints_to_keep=0)
        res = ck.resume()
        assert res.path.endswith("ep0-ba2"), res
        assert (disk / "ep0-ba2" / "manifest.json").is_file()  # loaded from it; kept till close
        ck.close(**close)
        assert sorted(p.name for p in disk.glob("ep0-*")) == [], disk
    store, run_uri = S3Store(), s3_root.join("s3run")
    assert remote_pointer(store, run_uri) == "ep0-ba2"  # the bucket still holds everything
    assert sorted(store.list_folders(run_uri)) == ["ep0-ba1", "ep0-ba2"]


def test_keep_local_zero_leaves_no_pointer_to_a_deleted_copy(tmp_path, s3_root, caplog):
    """The local latest.json and latest link went on naming the copy keep_local=0 deleted, and
    every later resume on that disk warned that the pointer named no valid checkpoint."""
    disk = tmp_path / "node"
    comps = make()
    ck = manager(s3_root, disk, comps, num_local_checkpoints_to_keep=0)
    for _ in range(2):
        step(*comps[:3])
        ck.batch_end(4)
    ck.close()
    assert sorted(p.name for p in disk.glob("ep*")) == []
    assert not (disk / "latest.json").exists()
    assert RunFolder(disk).latest_links() == {}
    with caplog.at_level(logging.INFO, "trainer_runtime"):
        again = manager(s3_root, disk, make(seed=4), num_local_checkpoints_to_keep=0)
        res = again.resume()
        again.close(save=False)
    assert res.source == "remote" and res.path.endswith("ep0-ba2"), res
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [w for w in warned if "latest" in w], warned


def test_keep_local_zero_keeps_at_close_a_local_checkpoint_the_bucket_lacks(tmp_path, s3_root):
    """close() deletes only local copies the bucket holds committed: one the bucket lacks
    (pruned there, or its upload dropped) is the only copy left, whatever keep_local says."""
    saved_run(s3_root, tmp_path / "node", batches=2)
    store, run_uri = S3Store(), s3_root.join("s3run")
    store.delete_prefix(run_uri.join("ep0-ba1"), first=("manifest.json",))
    ck = manager(s3_root, tmp_path / "node", make(seed=4), num_local_checkpoints_to_keep=0)
    assert ck.resume().path.endswith("ep0-ba2")
    ck.close()
    assert sorted(p.name for p in (tmp_path / "node").glob("ep0-*")) == ["ep0-ba1"]
    assert Manifest.read(tmp_path / "node" / "ep0-ba1").timestamp.batch == 1


def test_events_name_each_upload_and_the_remote_resume(tmp_path, s3_root, monkeypatch):
    """The runtime's events (docs/runtime.md) say what was uploaded and where a resume came from."""
    target = tmp_path / "events.jsonl"
    monkeypatch.setenv(envvars.EVENTS_FILE, str(target))
    saved_run(s3_root, tmp_path / "node-a", batches=2)
    ck2 = manager(s3_root, tmp_path / "node-b", make(seed=9))
    assert ck2.resume().source == "remote"
    ck2.close()
    run_uri = str(s3_root.join("s3run"))
    found = events.read_events(target.read_text())
    uploads = sorted(e["checkpoint"] for e in found if e.type == "uploaded")
    assert uploads == ["ep0-ba1", "ep0-ba2"], found
    assert all(e["uri"] == f"{run_uri}/{e['checkpoint']}" for e in found if e.type == "uploaded")
    assert all(e["bytes"] > 0 for e in found if e.type == "uploaded")
    committed = [e for e in found if e.type == "committed"]
    assert [e["uri"] for e in committed] == [f"{run_uri}/ep0-ba1", f"{run_uri}/ep0-ba2"]
    (resumed,) = [e for e in found if e.type == "resumed"]
    assert resumed["source"] == "remote" and resumed["uri"] == f"{run_uri}/ep0-ba2"
    assert resumed["step"] == 2 and resumed["saved_world_size"] == 1
    (fetched,) = [e for e in found if e.type == "fetched"]
    assert fetched["checkpoint"] == "ep0-ba2" and fetched["uri"] == f"{run_uri}/ep0-ba2"
    assert fetched["bytes"] > 0 and fetched["seconds"] >= 0
    assert fetched.time <= resumed.time


def test_local_copy_wins_when_it_is_newest(tmp_path, s3_root):
    comps = make()
    ck = manager(s3_root, tmp_path / "node", comps)
    ck.batch_end(4)
    ck.batch_end(4)
    ck.close()
    shutil.rmtree(tmp_path / "node" / "ep0-ba1")
    ck2 = manager(s3_root, tmp_path / "node", make(seed=3))
    res = ck2.resume()
    assert res.source == "checkpoint" and res.path.endswith("ep0-ba2")
    ck2.close()


def stale_disk(tmp_path, s3_root, comps):
    """A copy of a node's disk taken at ep0-ba1 (``<tmp>/stale``), while that node went on to
    commit ep0-ba3 in the store; returns that node's manager, still open, and the copy."""
    ck = manager(s3_root, tmp_path / "node-a", comps)
    step(*comps[:3])
    ck.batch_end(4)
    ck.close(save=False)
    stale = tmp_path / "stale"
    shutil.copytree(tmp_path / "node-a", stale, symlinks=True)
    ck = manager(s3_root, tmp_path / "node-a", comps)
    ck.resume()
    for _ in range(2):
        step(*comps[:3])
        ck.batch_end(4)
    return ck, stale


def test_a_stale_local_disk_resumes_from_the_newer_checkpoint_in_the_store(tmp_path, s3_root):
    """A node kept an earlier attempt's disk (ep0-ba1) while another attempt went on to ep0-ba3
    elsewhere: resume takes the store's newest, and the bucket's checkpoints survive."""
    comps = make()
    ck, stale = stale_disk(tmp_path, s3_root, comps)
    ck.close()
    store, run_uri = S3Store(), s3_root.join("s3run")
    newest = store.get_bytes(run_uri.join("ep0-ba3", "manifest.json"))

    again = make(seed=7)
    ck = manager(s3_root, stale, again)
    res = ck.resume()
    assert res.source == "remote" and res.path.endswith("ep0-ba3") and ck.timestamp.batch == 3
    assert all(torch.equal(a, b) for a, b in zip(params(again[0]), params(comps[0]), strict=True))
    step(*again[:3])
    ck.batch_end(4)
    ck.close()
    assert store.get_bytes(run_uri.join("ep0-ba3", "manifest.json")) == newest
    assert remote_pointer(store, run_uri) == "ep0-ba4"


def test_after_a_resume_from_the_store_the_local_pointer_and_link_name_it(tmp_path, s3_root):
    """A stale disk (its latest.json and latest-rank0 on ep0-ba1) and an empty one both resume
    ep0-ba3 from the store; each local run folder's pointer and link then name ep0-ba3, as
    after a commit, not the older checkpoint the stale disk still holds."""
    comps = make()
    ck, stale = stale_disk(tmp_path, s3_root, comps)
    ck.close(save=False)

    for disk in (stale, tmp_path / "empty"):
        ck = manager(s3_root, disk, make(seed=7))
        res = ck.resume()
        ck.close(save=False)
        assert res.source == "remote" and res.path.endswith("ep0-ba3")
        assert RunFolder(disk).pointer_name() == "ep0-ba3", disk
        assert os.readlink(disk / "latest-rank0") == "ep0-ba3", disk


def test_the_store_protects_its_checkpoints_from_a_run_with_an_empty_disk(tmp_path, s3_root):
    """Overwrite protection looks at the bucket too: a new pod's local folder is empty."""
    saved_run(s3_root, tmp_path / "node-a", batches=2)
    store, run_uri = S3Store(), s3_root.join("s3run")
    saved = store.get_bytes(run_uri.join("ep0-ba2", "manifest.json"))

    # The same run started over without resuming: its first save would replace them.
    ck = manager(s3_root, tmp_path / "node-b", make(seed=5), autoresume=False)
    with pytest.raises(OverwriteError, match=r"holds checkpoint ep0-ba2 \(batch 2\) at or after"):
        ck.batch_end(4)
    ck.close(save=False)
    assert store.get_bytes(run_uri.join("ep0-ba2", "manifest.json")) == saved
    # Another run name on this run's folder: refused at construction.
    with pytest.raises(OverwriteError, match=r"holds checkpoints of other run\(s\) s3run"):
        CheckpointManager(
            model=make()[0],
            folder=str(run_uri),
            local_folder=tmp_path / "node-c",
            run_name="other",
        )
    # overwrite=True: the newer remote checkpoints are uncommitted, then the run saves.
    ck = manager(s3_root, tmp_path / "node-d", make(seed=5), autoresume=False, overwrite=True)
    ck.batch_end(4)
    ck.close()
    assert store.get_bytes(run_uri.join("ep0-ba2", "manifest.json")) is None
    assert remote_pointer(store, run_uri) == "ep0-ba1"


def test_latest_json_moves_off_a_checkpoint_whose_manifest_was_damaged(tmp_path, s3_root):
    """The bucket's newest manifest is garbage (damaged from outside) and latest.json names it:
    resume falls back, and the pointer moves to a checkpoint that is whole, then on with the
    next upload (the pointer never moves back, so left there it would stay)."""
    comps = saved_run(s3_root, tmp_path / "node-a", batches=3)
    store, run_uri = S3Store(), s3_root.join("s3run")
    store.put_bytes(run_uri.join("ep0-ba3", "manifest.json"), b"{not json")
    assert remote_pointer(store, run_uri) == "ep0-ba3"

    ck = manager(s3_root, tmp_path / "node-b", make(seed=2))
    res = ck.resume()
    assert res.source == "remote" and res.path.endswith("ep0-ba2")
    assert remote_pointer(store, run_uri) == "ep0-ba2"
    step(*comps[:3])
    ck.batch_end(4)
    ck.close()
    assert remote_pointer(store, run_uri) == "ep0-ba3"  # the new ep0-ba3, whole
    assert (
        Manifest.from_json(
            store.get_bytes(run_uri.join("ep0-ba3", "manifest.json")), source="x"
        ).timestamp.batch
        == 3
    )


def test_load_path_from_the_store(tmp_path, s3_root):
    comps = make()
    ck = manager(s3_root, tmp_path / "src", comps)
    ck.batch_end(4)
    ck.close()
    target = make(seed=5)
    ft = CheckpointManager(
        model=target[0],
        folder=tmp_path / "ft",
        run_name="ft",
        load_path=f"{s3_root}/s3run/ep0-ba1",
        load_weights_only=True,
    )
    assert ft.resume().source == "load_path"
    assert torch.equal(target[0][0].weight, comps[0][0].weight)
    ft.close()


@pytest.mark.parametrize("fault", ["missing-bucket", "unreachable-endpoint"])
def test_bad_store_configuration_is_both_error_types(tmp_path, s3_root, monkeypatch, fault):
    """docs/object-store.md promises ``ObjectStoreConfigError``, docs/runtime.md a
    ``ConfigError``: either ``except`` catches it, and the message is the store's own, with
    where boto3 found the credentials."""
    folder = f"{s3_root}/{{run_name}}"
    if fault == "missing-bucket":
        folder, reason = "s3://no-such-bucket-rtj/p/{run_name}", "'no-such-bucket-rtj' does not"
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
        reason = "unreachable"
    with pytest.raises(ObjectStoreConfigError, match=reason) as err:
        CheckpointManager(model=make()[0], folder=folder, local_folder=tmp_path, run_name="r")
    assert isinstance(err.value, ConfigError)
    # docs/object-store.md: the error names where boto3 found credentials, never the keys.
    assert "credentials boto3 found: source env" in str(err.value)
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in str(err.value)


@pytest.mark.parametrize("source", ["folder", envvars.CHECKPOINT_DIR])
def test_a_missing_bucket_names_the_argument_or_variable_it_came_from(
    tmp_path, s3_env, monkeypatch, source
):
    """docs/object-store.md: errors on bad input name the argument; a missing bucket said
    only "cannot use s3://...", so a pod whose RTJ_CHECKPOINT_DIR came from its spec did not
    say which setting to fix."""
    uri = "s3://no-such-bucket-rtj/p"
    kwargs = {"model": make()[0], "local_folder": tmp_path, "run_name": "r"}
    if source == "folder":
        kwargs["folder"] = f"{uri}/{{run_name}}"
    else:
        monkeypatch.setenv(envvars.CHECKPOINT_DIR, uri)
    with pytest.raises(ObjectStoreConfigError) as err:
        CheckpointManager(**kwargs)
    message = str(err.value)
    assert f"({source}): bucket 'no-such-bucket-rtj' does not exist at" in message, message
    assert s3_env.url in message


@pytest.mark.parametrize(
    "setting",
    [
        ("AWS_ENDPOINT_URL_S3", "minio.example:9000", "expected a URL http://HOST"),
        ("AWS_REGION", "not a region!", "expected a region name"),
        ("AWS_PROFILE", "no-such-profile", "no such profile"),
        ("AWS_REQUEST_CHECKSUM_CALCULATION", "always", "expected when_required"),
        ("AWS_RESPONSE_CHECKSUM_VALIDATION", "never", "expected when_required"),
    ],
)
def test_a_store_setting_boto3_refuses_is_a_config_error_naming_the_variable(
    tmp_path, s3_root, monkeypatch, setting
):
    """docs/object-store.md (Configuration): a wrong endpoint, region, profile or checksum
    mode is an ``ObjectStoreConfigError`` naming the variable, its value and the expected
    form, not botocore's own exception (or a ConfigError naming neither)."""
    variable, value, expected = setting
    monkeypatch.setenv(variable, value)
    with pytest.raises(ObjectStoreConfigError) as err:
        CheckpointManager(
            model=make()[0], folder=f"{s3_root}/{{run_name}}", local_folder=tmp_path, run_name="r"
        )
    assert isinstance(err.value, ConfigError)
    assert f"{variable}={value!r}" in str(err.value)
    assert expected in str(err.value)


def test_an_endpoint_that_never_answers_fails_construction_within_the_probe_bound(
    tmp_path, s3_root, monkeypatch
):
    """A store that takes connections and never replies: construction fails after the probe's
    bounded waits (PROBE_READ_TIMEOUT_S x PROBE_ATTEMPTS), not botocore's 5 x 60 s."""
    monkeypatch.setattr(store_module, "PROBE_READ_TIMEOUT_S", 0.5)
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept_and_never_answer() -> None:
        with contextlib.suppress(OSError):  # closed at the end of the test
            while True:
                held.append(server.accept()[0])

    threading.Thread(target=accept_and_never_answer, daemon=True).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{server.getsockname()[1]}")
    started = time.monotonic()
    with pytest.raises(ObjectStoreConfigError, match="Read timeout"):
        CheckpointManager(
            model=make()[0], folder=f"{s3_root}/{{run_name}}", local_folder=tmp_path, run_name="r"
        )
    assert time.monotonic() - started < 0.5 * store_module.PROBE_ATTEMPTS + 10
    server.close()


def test_unusable_staging_folder_names_where_it_came_from(tmp_path, s3_root, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RTJ_LOCAL_CHECKPOINT_DIR", str(blocker / "staging"))
    folder = f"{s3_root}/{{run_name}}"
    with pytest.raises(ConfigError) as err:
        CheckpointManager(model=make()[0], folder=folder, run_name="r")
    assert "set RTJ_LOCAL_CHECKPOINT_DIR to a writable folder" in str(err.value)
    with pytest.raises(ConfigError) as err:
        CheckpointManager(model=make()[0], folder=folder, local_folder=blocker / "l", run_name="r")
    assert "pass local_folder= a writable folder" in str(err.value)


@pytest.mark.parametrize("local_folder", [5, "", "s3://bucket/staging"])
def test_a_local_folder_that_is_not_a_path_is_a_config_error(
    tmp_path, s3_root, local_folder, monkeypatch
):
    """``local_folder`` takes a folder's path: an int was a bare TypeError from ``Path()``,
    "" staged the checkpoints in the working directory, and an s3:// URI in a local folder
    named ``s3:``."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"local_folder={local_folder!r}: expected None or a"):
        CheckpointManager(
            model=make()[0],
            folder=f"{s3_root}/{{run_name}}",
            local_folder=local_folder,
            run_name="r",
        )
    assert list(tmp_path.iterdir()) == []


def test_a_staging_folder_variable_that_names_a_bucket_is_a_config_error(
    tmp_path, s3_root, monkeypatch
):
    """RTJ_LOCAL_CHECKPOINT_DIR=s3://... staged the checkpoints in a local folder named s3:."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RTJ_LOCAL_CHECKPOINT_DIR", "s3://bucket/staging")
    with pytest.raises(ConfigError, match=r"RTJ_LOCAL_CHECKPOINT_DIR='s3://bucket/staging': exp"):
        CheckpointManager(model=make()[0], folder=f"{s3_root}/{{run_name}}", run_name="r")
    assert list(tmp_path.iterdir()) == []


def test_a_local_folder_beside_a_local_run_folder_is_ignored_with_a_warning(tmp_path, caplog):
    ck = CheckpointManager(
        model=make()[0], folder=tmp_path / "run", local_folder=tmp_path / "stage", run_name="r"
    )
    ck.close()
    assert "local_folder=" in caplog.text
    assert "ignored" in caplog.text
    assert not (tmp_path / "stage").exists()


def test_malformed_uri_is_a_config_error(tmp_path, s3_env):
    with pytest.raises(ConfigError, match="folder"):
        CheckpointManager(
            model=make()[0], folder="s3:///nobucket/{run_name}", local_folder=tmp_path, run_name="r"
        )


def test_remote_fallbacks_are_reported_in_the_result_and_the_event(
    tmp_path, s3_env, s3_root, monkeypatch
):
    """docs/runtime.md: every newer checkpoint resume passed over is in
    ``ResumeResult.fallbacks`` and the ``resumed`` event, when it came from the bucket too."""
    saved_run(s3_root, tmp_path / "node-a", batches=5)
    client = s3_env.client()
    prefix = f"{s3_root.key}/s3run"
    client.delete_object(Bucket=s3_root.bucket, Key=f"{prefix}/ep0-ba5/.metadata")  # missing
    damaged = f"{prefix}/ep0-ba4/__0_0.distcp"  # same size and digest metadata, other bytes
    head = client.head_object(Bucket=s3_root.bucket, Key=damaged)
    body = bytearray(client.get_object(Bucket=s3_root.bucket, Key=damaged)["Body"].read())
    body[len(body) // 2] ^= 0xFF
    client.put_object(
        Bucket=s3_root.bucket, Key=damaged, Body=bytes(body), Metadata=head["Metadata"]
    )
    monkeypatch.setenv(envvars.QUARANTINED, "ep0-ba3")
    target = tmp_path / "events.jsonl"
    monkeypatch.setenv(envvars.EVENTS_FILE, str(target))

    ck2 = manager(s3_root, tmp_path / "node-b", make(seed=9))  # an empty disk
    res = ck2.resume()
    ck2.close(save=False)

    assert res.source == "remote" and res.path.endswith("ep0-ba2")
    passed = [line.split(":", 1)[0] for line in res.fallbacks]
    assert passed == ["ep0-ba5", "ep0-ba4", "ep0-ba3"], res.fallbacks
    assert ".metadata" in res.fallbacks[0] and "quarantined" in res.fallbacks[2]
    (resumed,) = [e for e in events.read_events(target.read_text()) if e.type == "resumed"]
    assert resumed["fallbacks"] == res.fallbacks


def test_a_store_where_no_checkpoint_verifies_is_not_emptied(tmp_path, s3_env, s3_root):
    """Every remote checkpoint fails its check (here each lost a file): resume stops and sets
    nothing aside, since a store answering wrongly is likelier; overwrite=True starts over."""
    saved_run(s3_root, tmp_path / "node-a", batches=2)
    client, prefix = s3_env.client(), f"{s3_root.key}/s3run"
    for name in ("ep0-ba1", "ep0-ba2"):
        client.delete_object(Bucket=s3_root.bucket, Key=f"{prefix}/{name}/.metadata")
    store, run_uri = S3Store(), s3_root.join("s3run")

    ck = manager(s3_root, tmp_path / "node-b", make(seed=4))
    with pytest.raises(NoCheckpointError, match=r"none of the object store's 2 committed"):
        ck.resume()
    ck.close(save=False)
    for name in ("ep0-ba1", "ep0-ba2"):
        assert store.get_bytes(run_uri.join(name, "manifest.json")) is not None

    ck = manager(s3_root, tmp_path / "node-c", make(seed=4), overwrite=True)
    assert ck.resume().source == "fresh"
    ck.close(save=False)
    assert store.get_bytes(run_uri.join("ep0-ba2", "manifest.json")) is None


def test_a_prune_cut_short_leaves_a_folder_resume_skips_and_prune_keeps(
    tmp_path, s3_env, s3_root, caplog
):
    """A prune killed after deleting ep0-ba1's manifest (it goes first) leaves ep0-ba1's data:
    the next run resumes from the newest checkpoint with a log line about ep0-ba1, and its own
    prunes (keep_remote=1) never delete a folder without a manifest."""
    saved_run(s3_root, tmp_path / "node-a", batches=3)
    client, prefix = s3_env.client(), f"{s3_root.key}/s3run"
    client.delete_object(Bucket=s3_root.bucket, Key=f"{prefix}/ep0-ba1/manifest.json")
    leftover = {
        o["Key"]
        for o in client.list_objects_v2(Bucket=s3_root.bucket, Prefix=f"{prefix}/ep0-ba1/")[
            "Contents"
        ]
    }
    comps = make()
    ck = manager(s3_root, tmp_path / "node-b", comps, num_remote_checkpoints_to_keep=1)
    with caplog.at_level("INFO", logger="trainer_runtime"):
        assert ck.resume().path.endswith("ep0-ba3")
    assert "ep0-ba1 is not a checkpoint" in caplog.text and "(not committed)" in caplog.text
    for _ in range(2):
        step(*comps[:3])
        ck.batch_end(4)
    ck.close()
    keys = {
        o["Key"] for o in client.list_objects_v2(Bucket=s3_root.bucket, Prefix=prefix)["Contents"]
    }
    assert leftover <= keys
    committed = sorted(k.split("/")[-2] for k in keys if k.endswith("/manifest.json"))
    assert committed == ["ep0-ba5"]
