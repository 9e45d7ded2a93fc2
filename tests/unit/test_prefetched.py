"""A loop that fetches the next batch before the optimizer step (nanoGPT's) resumes bit for bit
with ``Prefetched``, and a step-based loop (``ckpt.steps``) re-run after its end trains no step.

Real processes and a real SIGTERM: the interrupted run saves on the signal and exits 143, the
next run resumes; the final weights are compared with an uninterrupted run's. The same loop
without ``Prefetched`` diverges, which shows the comparison can fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer_runtime import ConfigError, Prefetched

REPO = Path(__file__).resolve().parents[2]

NANOGPT_LIKE = """
import os, signal, sys
import torch
from trainer_runtime import CheckpointManager, Prefetched

folder, out, stop_at, wrapped = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
torch.manual_seed(1337)
data = torch.arange(4096) % 97
model = torch.nn.Sequential(torch.nn.Embedding(97, 16), torch.nn.Dropout(0.2),
                            torch.nn.Linear(16, 97))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

def get_batch():
    ix = torch.randint(len(data) - 9, (4,))  # random offsets: the global generator
    x = torch.stack([data[i:i + 8] for i in ix])
    y = torch.stack([data[i + 1:i + 9] for i in ix])
    return x, y

fetch = Prefetched(get_batch) if wrapped else get_batch
stateful = {"batches": fetch} if wrapped else None
ck = CheckpointManager(model=model, optimizer=opt, folder=folder, run_name="r",
                       interval="4ba", stateful=stateful)
ck.resume()
trained = 0
X, Y = fetch()  # the first batch: fetched before the loop, as nanoGPT does
for step in ck.steps(12):
    if step == stop_at:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler sets a flag; batch_end saves
    for micro in range(2):
        logits = model(X)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, 97), Y.view(-1)) / 2
        X, Y = fetch()  # the next batch, fetched while this step runs
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    trained += 1
    ck.batch_end(8)
ck.close()
torch.save(model.state_dict(), out)
print(f"trained {trained} steps", file=sys.stderr)
"""


def run(tmp: Path, folder: str, stop_at: int, wrapped: bool) -> subprocess.CompletedProcess[str]:
    script = tmp / "train.py"
    script.write_text(NANOGPT_LIKE)
    return subprocess.run(
        [sys.executable, str(script), str(tmp / folder), str(tmp / f"{folder}.pt"),
         str(stop_at), "1" if wrapped else "0"],
        check=False,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=180,
    )  # fmt: skip


def weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("wrapped", [True, False])
def test_a_prefetching_loop_resumed_after_sigterm(tmp_path, wrapped):
    whole = run(tmp_path, "whole", -1, wrapped)
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert "trained 12 steps" in whole.stderr
    cut = run(tmp_path, "cut", 6, wrapped)
    assert cut.returncode == 128 + signal.SIGTERM, cut.stderr[-2000:]
    rest = run(tmp_path, "cut", -1, wrapped)
    assert rest.returncode == 0, rest.stderr[-2000:]
    assert "trained 5 steps" in rest.stderr  # steps 7..11: the emergency save was at step 7
    same = bitwise_equal(weights(tmp_path / "whole.pt"), weights(tmp_path / "cut.pt"))
    if wrapped:
        assert same, "the resumed prefetching loop diverged from the uninterrupted run"
    else:
        assert not same, "without Prefetched the resumed loop trains another batch"


def test_a_finished_step_based_job_re_run_trains_no_step(tmp_path):
    first = run(tmp_path, "done", -1, True)
    assert "trained 12 steps" in first.stderr
    again = run(tmp_path, "done", -1, True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "trained 0 steps" in again.stderr
    assert bitwise_equal(weights(tmp_path / "done.pt"), weights(tmp_path / "done.pt"))


def test_prefetched_replays_the_batch_fetched_ahead_once():
    counter = iter(range(100))
    fetch = Prefetched(counter)
    assert [fetch(), fetch()] == [0, 1]
    saved = fetch.state_dict()
    resumed = Prefetched(iter(range(2, 100)))
    resumed.load_state_dict(saved)
    assert [resumed(), resumed()] == [1, 2]
    assert Prefetched(lambda: 5).state_dict() == {"ahead": False}


def test_prefetched_saves_tensors_on_the_cpu_and_keeps_the_batch_shape():
    batch = {"x": torch.ones(2), "meta": ("a", 3), "ys": [torch.zeros(1)]}
    fetch = Prefetched(lambda: batch)
    fetch()
    state = fetch.state_dict()
    assert state["devices"] == {"x": "cpu", "meta": [None, None], "ys": ["cpu"]}
    again = Prefetched(lambda: None)
    again.load_state_dict(state)
    got = again()
    assert torch.equal(got["x"], batch["x"]) and got["meta"] == ("a", 3)
    assert isinstance(got["ys"], list) and torch.equal(got["ys"][0], batch["ys"][0])


def test_prefetched_refuses_what_is_neither_a_function_nor_an_iterator():
    with pytest.raises(ConfigError, match="Prefetched"):
        Prefetched([1, 2, 3])  # a list: iter(list) is what was meant
