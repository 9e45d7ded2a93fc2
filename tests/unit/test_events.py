"""Structured runtime events (trainer_runtime/events.py): the schema, one line per event, appends
from several processes, a bad RTJ_EVENTS_FILE, and the CheckpointManager's own events."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainer_runtime import CheckpointManager, envvars, events

from .trainkit import make

REPO = Path(__file__).resolve().parents[2]


def stderr_events(text: str) -> list[events.RuntimeEvent]:
    lines = [line for line in text.splitlines() if line.startswith(events.PREFIX)]
    parsed = events.read_events(lines)
    assert len(parsed) == len(lines), "every rtj-event line parses"
    return parsed


def test_every_type_writes_its_schema_as_one_line(tmp_path, monkeypatch, capsys):
    target = tmp_path / "events.jsonl"
    monkeypatch.setenv(envvars.EVENTS_FILE, str(target))
    events.fresh(rank=0, run="r", world_size=2)
    events.notice(rank=1, content='{"reason": "spot", "node": "n"}', step=7)
    events.notice(rank=1, content="plain text notice", step=8)
    events.sigterm(rank=0, step=9, grace_period_s=30.0)
    events.emergency_saved(
        rank=0, checkpoint="ep0-ba9", step=9, seconds=0.4321, grace_period_s=30.0
    )
    events.uploaded(rank=1, checkpoint="ep0-ba9", uri="s3://b/r/ep0-ba9", sent=10, seconds=1.0)
    events.resumed(
        rank=0,
        run="r",
        source="remote",
        path=str(tmp_path / "nowhere" / "ep0-ba9"),
        uri="s3://b/r/ep0-ba9",
        step=9,
        epoch=0,
        fallbacks=["ep0-ba12: torn"],
        world_size=2,
    )
    lines = target.read_text().splitlines()
    assert len(lines) == 7
    raw = [json.loads(line) for line in lines]
    for item in raw:
        assert item["v"] == events.SCHEMA_VERSION
        assert set(item) == {"v", "type", "rank", "time", *events.FIELDS[item["type"]]}
        assert item["time"].endswith("+00:00")
    assert [r["type"] for r in raw] == [
        "fresh",
        "notice",
        "notice",
        "sigterm",
        "emergency_saved",
        "uploaded",
        "resumed",
    ]
    assert raw[1]["reason"] == "spot" and raw[1]["rank"] == 1
    assert raw[2]["reason"] == "plain text notice"
    assert raw[4]["seconds"] == 0.432
    resumed = raw[6]
    assert resumed["source"] == "remote" and resumed["checkpoint"] == "ep0-ba9"
    assert resumed["fallbacks"] == ["ep0-ba12: torn"] and resumed["saved_world_size"] is None
    # The same events on stderr, prefixed, in the same order and content.
    on_stderr = stderr_events(capsys.readouterr().err)
    assert [e.type for e in on_stderr] == [r["type"] for r in raw]
    assert on_stderr[6]["uri"] == "s3://b/r/ep0-ba9"


def test_unknown_types_and_fields_are_refused():
    with pytest.raises(ValueError, match="event type 'bogus'"):
        events.emit("bogus", rank=0)
    with pytest.raises(ValueError, match="fields"):
        events.emit(events.SIGTERM, rank=0, step=1)


def test_readers_skip_other_lines_and_other_versions():
    good = events.PREFIX + json.dumps({"v": 1, "type": "fresh", "rank": 0, "time": "t", "run": "r"})
    newer = good.replace('"v": 1', '"v": 2')
    text = "\n".join(["2026 INFO a log line", good, newer, "rtj-event {not json", "{}", good])
    found = events.read_events(text)
    assert [e.type for e in found] == ["fresh", "fresh"] and found[0]["run"] == "r"
    assert events.read_events(text, "committed") == []


WRITER = textwrap.dedent(
    """
    import sys
    from trainer_runtime import events
    rank, count = int(sys.argv[1]), int(sys.argv[2])
    for i in range(count):
        events.uploaded(rank=rank, checkpoint=f"c{i}", uri="s3://b/" + "x" * 3000, sent=i,
                        seconds=0.0)
    """
)


def test_several_ranks_append_whole_lines_to_one_file(tmp_path):
    target = tmp_path / "shared" / "events.jsonl"
    target.parent.mkdir()
    env = {**os.environ, envvars.EVENTS_FILE: str(target), "PYTHONPATH": str(REPO)}
    count, ranks = 200, 4
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(rank), str(count)],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        for rank in range(ranks)
    ]
    assert all(p.wait(60) == 0 for p in procs)
    lines = target.read_text().splitlines()
    assert len(lines) == count * ranks
    parsed = [json.loads(line) for line in lines]  # a torn line would not parse
    for rank in range(ranks):
        mine = [p["bytes"] for p in parsed if p["rank"] == rank]
        assert mine == list(range(count)), f"rank {rank}: lost or reordered events"


@pytest.mark.parametrize("where", ["missing-folder", "a-folder"])
def test_a_bad_events_file_is_named_once_and_never_raises(tmp_path, monkeypatch, caplog, where):
    bad = tmp_path / "no" / "such" / "events.jsonl" if where == "missing-folder" else tmp_path
    monkeypatch.setenv(envvars.EVENTS_FILE, str(bad))
    with caplog.at_level(logging.WARNING, "trainer_runtime.events"):
        events.fresh(rank=0, run="r", world_size=1)
        events.fresh(rank=0, run="r", world_size=1)
    warnings = [r.getMessage() for r in caplog.records if r.name == "trainer_runtime.events"]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"RTJ_EVENTS_FILE={bad}: cannot append runtime events")
    assert "training goes on" in warnings[0]


def test_training_with_a_bad_events_file_saves_resumes_and_reports(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(envvars.EVENTS_FILE, str(tmp_path / "missing" / "events.jsonl"))
    ck = CheckpointManager(model=make()[0], folder=tmp_path / "ck", run_name="r", interval="2ba")
    assert ck.resume().source == "fresh"
    for _ in range(4):
        ck.batch_end(4)
    ck.close()
    again = CheckpointManager(model=make()[0], folder=tmp_path / "ck", run_name="r")
    assert again.resume().timestamp.batch == 4
    again.close(save=False)
    every = stderr_events(capfd.readouterr().err)
    kinds = ["started", "fresh", "first_step", "committed", "committed", "started", "resumed"]
    assert [e.type for e in every] == kinds
    started, first_step = every[0], every[2]
    assert started["world_size"] == 1 and started["attempt"] is None
    assert started["process_started"] is not None and started["process_started"] < started.time
    assert first_step["step"] == 1 and 0 <= first_step["seconds"] < 60
    found = [e for e in every if e.type not in ("started", "first_step")]
    first, second = found[1], found[2]
    assert (first["checkpoint"], first["step"]) == ("ep0-ba2", 2)
    assert (second["checkpoint"], second["step"]) == ("ep0-ba4", 4)
    assert second["bytes"] > 0 and second["uri"] == str(tmp_path / "ck" / "ep0-ba4")
    resumed = found[3]
    assert resumed["source"] == "local" and resumed["checkpoint"] == "ep0-ba4"
    assert resumed["step"] == 4 and resumed["saved_world_size"] == 1
    assert resumed["fallbacks"] == []


def test_sigterm_and_notice_events(tmp_path, monkeypatch, capfd):
    target = tmp_path / "events.jsonl"
    monkeypatch.setenv(envvars.EVENTS_FILE, str(target))
    notice = tmp_path / "notice"
    notice.write_text("")
    ck = CheckpointManager(
        model=make()[0],
        folder=tmp_path / "ck",
        run_name="r",
        interval="100ba",
        notice_file=str(notice),
    )
    ck.batch_end(1)
    notice.write_text('{"reason": "cloud.google.com/impending-node-termination"}')
    time.sleep(1.1)  # the notice file is looked at once a second
    assert ck.batch_end(1) is not None
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(SystemExit):
        ck.batch_end(1)
    found = [e for e in events.read_events(target.read_text()) if e.type != "started"]
    kinds = [e.type for e in found]
    assert kinds == ["notice", "committed", "sigterm", "committed", "emergency_saved"], kinds
    assert found[0]["reason"] == "cloud.google.com/impending-node-termination"
    assert found[0]["step"] == 2 and found[1]["checkpoint"] == "ep0-ba2"
    saved = found[4]
    assert saved["checkpoint"] == "ep0-ba3" and saved["step"] == 3
    assert saved["seconds"] is not None and 0 <= saved["seconds"] < saved["grace_period_s"]
    assert stderr_events(capfd.readouterr().err)[-1].type == "emergency_saved"


def test_a_load_path_run_folder_reports_the_checkpoint_it_loaded(tmp_path, monkeypatch):
    """``load_path`` names a run folder whose newest checkpoint is damaged: the result and the
    ``resumed`` event name the older checkpoint loaded, its world size and the one passed over."""
    target = tmp_path / "events.jsonl"
    monkeypatch.setenv(envvars.EVENTS_FILE, str(target))
    model, opt = make()[:2]
    source = CheckpointManager(model=model, optimizer=opt, folder=tmp_path / "src", run_name="s")
    source.batch_end(1)
    source.save()
    source.batch_end(1)
    source.save()
    source.close(save=False)
    data = next((tmp_path / "src" / "ep0-ba2").glob("*.distcp"))
    raw = bytearray(data.read_bytes())
    raw[-100] ^= 0xFF
    data.write_bytes(bytes(raw))

    model, opt = make(seed=1)[:2]
    ck = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=tmp_path / "new",
        run_name="n",
        load_path=tmp_path / "src",
    )
    result = ck.resume()
    ck.close(save=False)
    assert result.source == "load_path" and result.path == str(tmp_path / "src" / "ep0-ba1")
    assert len(result.fallbacks) == 1 and result.fallbacks[0].startswith("ep0-ba2: ")
    (resumed,) = [
        e for e in events.read_events(target.read_text().splitlines()) if e.type == "resumed"
    ]
    assert resumed["checkpoint"] == "ep0-ba1" and resumed["saved_world_size"] == 1
    assert resumed["uri"] == result.path and resumed["fallbacks"] == result.fallbacks


KILLED_AFTER_COMMIT = """
import os, signal, sys, time
import torch
from trainer_runtime import CheckpointManager
from trainer_runtime.run.context import Position

def killed(self, *args, **kwargs):  # the first thing after the commit: a hard kill here
    os.kill(os.getpid(), signal.SIGKILL)

Position.mark_saved = killed
model = torch.nn.Linear(4, 4)
ck = CheckpointManager(
    model=model, folder=sys.argv[1], run_name="r", interval="5ba", async_save={async_save}
)
for step in range(20):
    ck.batch_end(4)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("async_save", [True, False])
def test_a_kill_right_after_the_commit_leaves_its_committed_event(tmp_path, async_save):
    """The manifest is the commit; its event must not wait for the pointer, links or barrier."""
    target = tmp_path / "events.jsonl"
    script = tmp_path / "job.py"
    script.write_text(KILLED_AFTER_COMMIT.format(async_save=async_save))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ck")],
        check=False,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", envvars.EVENTS_FILE: str(target)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    manifests = sorted((tmp_path / "ck").rglob("manifest.json"))
    assert [m.parent.name for m in manifests] == ["ep0-ba5"]
    committed = [
        e for e in events.read_events(target.read_text().splitlines()) if e.type == "committed"
    ]
    assert [e.fields["checkpoint"] for e in committed] == ["ep0-ba5"]
