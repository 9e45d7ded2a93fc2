"""SIGKILL real training processes at random moments, most of them inside a save.

After every kill: each committed checkpoint verifies on every rank, latest.json names a committed
one, and the relaunched gang resumes from exactly the newest committed checkpoint.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from .checks import committed_and_valid, read_events, wait_for_gang
from .launch import Gang

pytestmark = pytest.mark.multiproc
WORKER = Path(__file__).with_name("save_worker.py")
KILLS = 5


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_sigkill_during_saves_never_yields_a_torn_resume(tmp_path, mode):
    rng = random.Random(f"kill-{mode}")
    folder, events = tmp_path / "ck", tmp_path / "events"
    args = ["--folder", str(folder), "--steps", "100000", "--events", str(events), "--keep", "4"]
    if mode == "async":
        args.append("--async-save")
    expected: str | None = None
    for attempt in range(KILLS + 1):
        seen = [len(read_events(events, r)) for r in range(2)]
        last = attempt == KILLS
        steps_args = args
        if last:
            steps_args = [*args[:3], str(10**9), *args[4:]]
        gang = Gang(WORKER, steps_args, 2, tmp_path / "logs")

        def resumed(seen=seen):
            return all(len(read_events(events, r)) > seen[r] + 2 for r in range(2))

        wait_for_gang(resumed, 120, "both ranks to resume and train", gang)
        for r in range(2):
            ev = read_events(events, r)[seen[r]]
            assert ev["event"] == "resumed"
            got = None if ev["path"] is None else Path(ev["path"]).name
            assert got == expected, f"attempt {attempt} rank {r} resumed {got}, want {expected}"
        if last:
            gang.kill()
            break
        time.sleep(rng.uniform(0.0, 1.5))
        if rng.random() < 0.3:  # one rank first, the other a moment later (a lost node)
            gang.signal(signal.SIGKILL, [rng.randrange(2)])
            time.sleep(rng.uniform(0.0, 0.3))
        gang.kill()
        names = committed_and_valid(folder, settled=False)
        assert names, "no checkpoint committed before the kill"
        expected = names[0]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_rank_killed_mid_save_ends_the_others_with_an_error_not_a_hang(tmp_path, mode):
    """One rank SIGKILLed while every batch saves: the other rank's next collective on the
    coordination group fails (gloo: the peer's connection is gone) and the process exits with
    an error instead of waiting out the coordination timeout (10 minutes); every committed
    checkpoint verifies."""
    folder, events = tmp_path / "ck", tmp_path / "events"
    args = ["--folder", str(folder), "--steps", "100000", "--events", str(events)]
    if mode == "async":
        args.append("--async-save")
    gang = Gang(WORKER, args, 2, tmp_path / "logs")
    try:
        wait_for_gang(lambda: len(read_events(events, 1)) > 4, 120, "a few saves", gang)
        gang.signal(signal.SIGKILL, [1])
        code = gang.procs[0].wait(120)
    finally:
        gang.kill()
    log = (tmp_path / "logs" / "rank0.log").read_text()
    assert code == 1, log[-3000:]
    assert "Connection reset by peer" in log or "Connection closed by peer" in log, log[-3000:]
    assert committed_and_valid(folder, settled=False)
