"""``rtj-checkpoints export --format safetensors|dcp`` (and ``--dtype``): checkpoints saved by
the runtime itself (one process, a 2-rank FSDP2 gang, format version 1, an ``s3://`` run
folder) read back through the reference readers, ``safetensors.torch.load_file`` and stock
``dcp.load`` with ``FileSystemReader``, bitwise equal to the weights saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors import safe_open
from safetensors.torch import load_file

from trainer_runtime import CheckpointManager, ConfigError, Manifest
from trainer_runtime.cli import main as cli_main
from trainer_runtime.export import export_checkpoint
from trainer_runtime.export_formats import hf_safetensors as st_mod
from trainer_runtime.export_formats.source import WeightSource, open_source

from .test_v1_compat import write_v1
from .trainkit import make, saved_after_one_step, saved_weights, step

REPO = Path(__file__).resolve().parents[2]
INDEX = "model.safetensors.index.json"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``rtj-checkpoints`` as a real process, this checkout's runtime."""
    penv = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        **(env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "trainer_runtime.cli", *args],
        env=penv,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    """A one-process (format version 2) checkpoint of ``trainkit.make()``: floating weights and
    an int64 ``num_batches_tracked``."""
    saved_after_one_step(tmp_path)
    return tmp_path / "ck" / "ep0-ba1"


def read_safetensors_folder(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an exported folder, file by file as the index maps them; checks the
    index against what each file holds."""
    index = json.loads((folder / INDEX).read_text())
    files = sorted(p.name for p in folder.glob("*.safetensors"))
    assert sorted(set(index["weight_map"].values())) == files
    got: dict[str, torch.Tensor] = {}
    for name in files:
        tensors = load_file(folder / name)
        assert {k for k, f in index["weight_map"].items() if f == name} == set(tensors)
        got.update(tensors)
    total = sum(t.numel() * t.element_size() for t in got.values())
    assert index["metadata"]["total_size"] == total
    return got


def read_dcp_folder(folder: Path, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Stock DCP's load, no process group, into fresh tensors shaped as ``like``."""
    state = {k: torch.full_like(v, 7) for k, v in like.items()}
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(folder)))
    return state


def assert_bitwise(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        assert torch.equal(got[k].view(-1).view(torch.uint8), v.view(-1).view(torch.uint8)), k


def cast(weights: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return {k: v.to(dtype) if v.is_floating_point() else v for k, v in weights.items()}


# ------------------------------------------------------------------ safetensors


def test_safetensors_folder_reads_back_bitwise_in_one_file_by_default(ckpt, tmp_path):
    expected = saved_weights(ckpt)
    done = export_checkpoint(ckpt, tmp_path / "hf", fmt="safetensors")
    assert done.checkpoint == ckpt and done.left_out == []
    assert sorted(os.listdir(tmp_path / "hf")) == ["model-00001-of-00001.safetensors", INDEX]
    got = read_safetensors_folder(tmp_path / "hf")
    assert_bitwise(got, expected)
    assert got["1.num_batches_tracked"].dtype == torch.int64
    model = make()[0]
    model.load_state_dict(got)  # the plain model takes it
    with safe_open(str(tmp_path / "hf" / "model-00001-of-00001.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}  # what transformers checks


def test_a_small_max_shard_size_splits_the_files_and_the_index_maps_them(ckpt, tmp_path):
    expected = saved_weights(ckpt)
    assert (
        cli_main(
            [
                "export",
                "--format",
                "safetensors",
                "--max-shard-size",
                "100",
                str(ckpt),
                str(tmp_path / "hf"),
            ]
        )
        == 0
    )
    files = sorted(p.name for p in (tmp_path / "hf").glob("*.safetensors"))
    n = len(files)
    assert n > 2 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    for name in files:  # within the limit, but for a tensor larger than it, alone in its file
        tensors = load_file(tmp_path / "hf" / name)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        assert size <= 100 or len(tensors) == 1, (name, size)
    # The checkpoint's order is kept: each file holds the next tensors in line.
    index = json.loads((tmp_path / "hf" / INDEX).read_text())["weight_map"]
    order = [index[k] for k in expected]
    assert order == sorted(order)
    assert_bitwise(read_safetensors_folder(tmp_path / "hf"), expected)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("5GB", 5 * 10**9),
        ("500MiB", 500 << 20),
        ("1024", 1024),
        ("2 kb", 2000),
        ("1.5GiB", 3 << 29),
    ],
)
def test_max_shard_size_takes_bytes_and_units(text, size):
    assert st_mod.parse_size(text) == size


@pytest.mark.parametrize("bad", ["5XB", "", "GB", "-1", "0", "1e9"])
def test_a_bad_max_shard_size_names_the_option(bad, ckpt, tmp_path, capsys):
    with pytest.raises(ConfigError, match="--max-shard-size"):
        st_mod.parse_size(bad)
    out = tmp_path / "hf"
    assert (
        cli_main(
            ["export", "--format", "safetensors", "--max-shard-size", bad, str(ckpt), str(out)]
        )
        == 2
    )
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"rtj-checkpoints: --max-shard-size={bad!r}: expected"), line
    assert not out.exists()


class CountingSource(WeightSource):
    """Another source's tensors, each read's size recorded."""

    def __init__(self, inner: WeightSource) -> None:
        super().__init__(inner.checkpoint, inner.entries, inner.others, cast=inner.cast)
        self.inner = inner
        self.batches: list[int] = []

    def _read(self, names):
        got = self.inner.read(names)
        self.batches.append(sum(t.numel() * t.element_size() for t in got.values()))
        return got


@pytest.mark.parametrize("fmt", ["safetensors", "dcp"])
def test_the_folder_formats_read_a_batch_at_a_time(fmt, ckpt, tmp_path):
    """The weights come in reads of at most ``read_batch`` bytes (a larger tensor alone), each
    tensor read once: never the whole model in memory."""
    from trainer_runtime.export_formats import dcp as export_dcp

    source = CountingSource(open_source(ckpt, Manifest.read(ckpt), trusted=False, cast=None))
    largest = max(e.stored_nbytes for e in source.entries)
    (tmp_path / "out").mkdir()
    if fmt == "safetensors":
        st_mod.write_folder(source, tmp_path / "out", max_shard_size=10**9, read_batch=64)
    else:
        export_dcp.write_folder(source, tmp_path / "out", read_batch=64)
    assert len(source.batches) > 3
    assert all(b <= max(64, largest) for b in source.batches), source.batches
    assert sum(source.batches) == sum(e.stored_nbytes for e in source.entries)


# ------------------------------------------------------------------ dcp


def test_dcp_folder_loads_with_stock_dcp_and_file_system_reader(ckpt, tmp_path):
    expected = saved_weights(ckpt)
    done = export_checkpoint(ckpt, tmp_path / "dcp", fmt="dcp")
    assert sorted(done.files) == [".metadata", "__0_0.distcp"]
    assert_bitwise(read_dcp_folder(tmp_path / "dcp", expected), expected)
    model = make(seed=3)[0]
    state = model.state_dict()
    dcp.load(state, checkpoint_id=str(tmp_path / "dcp"))  # the model's own state dict
    model.load_state_dict(state)
    assert_bitwise(model.state_dict(), expected)


# ------------------------------------------------------------------ --dtype


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_dtype_casts_floating_tensors_and_keeps_integer_ones(name, ckpt, tmp_path):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[name]
    expected = cast(saved_weights(ckpt), dtype)
    assert expected["1.num_batches_tracked"].dtype == torch.int64
    export_checkpoint(ckpt, tmp_path / "hf", fmt="safetensors", dtype=name)
    assert_bitwise(read_safetensors_folder(tmp_path / "hf"), expected)
    export_checkpoint(ckpt, tmp_path / "dcp", fmt="dcp", dtype=name)
    assert_bitwise(read_dcp_folder(tmp_path / "dcp", expected), expected)
    export_checkpoint(ckpt, tmp_path / "w.pt", dtype=name)
    assert_bitwise(torch.load(tmp_path / "w.pt", weights_only=True), expected)


def test_a_bad_dtype_or_format_names_the_option(ckpt, tmp_path, capsys):
    with pytest.raises(ConfigError, match="--dtype='int8': expected one of bf16, fp16, fp32"):
        export_checkpoint(ckpt, tmp_path / "x", fmt="dcp", dtype="int8")
    with pytest.raises(ConfigError, match="--format='onnx'"):
        export_checkpoint(ckpt, tmp_path / "x", fmt="onnx")
    with pytest.raises(SystemExit):
        cli_main(["export", "--dtype", "int8", str(ckpt), str(tmp_path / "x")])
    assert "argument --dtype: invalid choice: 'int8'" in capsys.readouterr().err
    assert (
        cli_main(
            ["export", "--format", "dcp", "--max-shard-size", "1GB", str(ckpt), str(tmp_path / "x")]
        )
        == 2
    )
    assert "--max-shard-size applies to --format safetensors only" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ------------------------------------------------------------------ OUT


@pytest.mark.parametrize("fmt", ["safetensors", "dcp"])
def test_out_must_be_a_new_or_empty_local_folder(fmt, ckpt, tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for out, says in (
        (full, "is a folder that is not empty"),
        (afile, "is a file"),
        (afile / "sub", "is a file, not a folder"),
        ("s3://bucket/out", "export writes a local folder"),
    ):
        assert cli_main(["export", "--format", fmt, str(ckpt), str(out)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f"rtj-checkpoints: OUT={str(out)!r}") and says in line, line
    assert os.listdir(full) == ["keep.txt"] and afile.read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["export", "--format", fmt, str(ckpt), str(empty)]) == 0
    assert os.listdir(empty)
    assert sorted(os.listdir(tmp_path)) == ["afile", "ck", "empty", "full"]


@pytest.mark.parametrize("fmt", ["safetensors", "dcp"])
def test_a_failed_export_leaves_no_folder_behind(fmt, ckpt, tmp_path, monkeypatch, capsys):
    """A failure midway (here, the disk filling up after the first file) leaves neither OUT
    nor the temporary folder beside it; an empty OUT stays as it was."""
    from trainer_runtime.export_formats import dcp as export_dcp

    calls = {"n": 0}
    real = torch.save if fmt == "dcp" else st_mod._write_file

    def fail_second(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] >= 2:
            raise OSError(28, "No space left on device")
        return real(*args, **kwargs)

    if fmt == "dcp":
        monkeypatch.setattr(export_dcp.torch, "save", fail_second)
    else:
        monkeypatch.setattr(st_mod, "_write_file", fail_second)
    args = ["export", "--format", fmt, str(ckpt), str(tmp_path / "out" / "w")]
    if fmt == "safetensors":
        args += ["--max-shard-size", "100"]
    assert cli_main(args) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "Traceback" not in err
    assert os.listdir(tmp_path / "out") == []
    (tmp_path / "out" / "w").mkdir()
    assert cli_main(args) == 1
    assert os.listdir(tmp_path / "out") == ["w"] and os.listdir(tmp_path / "out" / "w") == []


def test_a_damaged_checkpoint_is_refused_before_anything_is_written(ckpt, tmp_path, capsys):
    data = ckpt / "__0_0.distcp"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert cli_main(["export", "--format", "safetensors", str(ckpt), str(tmp_path / "hf")]) == 1
    assert "does not verify" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["ck"]


# ------------------------------------------------------------------ sources


def test_a_format_version_1_checkpoint_exports_from_rank_0s_file(tmp_path):
    comps = make()
    write_v1(tmp_path / "v1", comps, batch=2, world_size=2)
    expected = {k: v.clone() for k, v in comps[0].state_dict().items()}
    export_checkpoint(tmp_path / "v1", tmp_path / "hf", fmt="safetensors", max_shard_size=100)
    assert_bitwise(read_safetensors_folder(tmp_path / "hf"), expected)
    export_checkpoint(tmp_path / "v1", tmp_path / "dcp", fmt="dcp", dtype="bf16")
    bf16 = cast(expected, torch.bfloat16)
    assert_bitwise(read_dcp_folder(tmp_path / "dcp", bf16), bf16)


def test_the_cli_as_a_real_process_writes_both_folder_formats(ckpt, tmp_path):
    expected = saved_weights(ckpt)
    run = ckpt.parent
    got = cli(
        "export",
        "--format",
        "safetensors",
        "--max-shard-size",
        "0.0001MB",
        str(run),
        str(tmp_path / "hf"),
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.startswith(f"exported the model weights of {ckpt} to {tmp_path / 'hf'}")
    assert "safetensors: " in got.stdout and got.stderr == ""
    assert len(list((tmp_path / "hf").glob("*.safetensors"))) > 2
    assert_bitwise(read_safetensors_folder(tmp_path / "hf"), expected)
    got = cli("export", "--format", "dcp", "--dtype", "fp16", str(run), str(tmp_path / "dcp"))
    assert got.returncode == 0, got.stderr
    assert "floating tensors as fp16" in got.stdout
    expected16 = cast(expected, torch.float16)
    assert_bitwise(read_dcp_folder(tmp_path / "dcp", expected16), expected16)
    again = cli("export", "--format", "dcp", str(run), str(tmp_path / "dcp"))
    assert again.returncode == 2 and "is a folder that is not empty" in again.stderr


@pytest.mark.multiproc
@pytest.mark.skipif(sys.platform != "linux", reason="gloo multi-process on Linux")
@pytest.mark.timeout(600)
def test_a_two_rank_fsdp2_checkpoint_exports_from_one_process(tmp_path):
    """FSDP2 shards each weight over the ranks' files; one process exports it whole."""
    from tests.multiproc.launch import Gang

    worker = REPO / "tests" / "multiproc" / "fsdp_manager_worker.py"
    (tmp_path / "out").mkdir()
    args = ["--folder", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--steps", "2"]
    gang = Gang(worker, [*args, "--width", "48"], 2, tmp_path / "logs")
    codes = gang.wait(300)
    logs = {p.name: p.read_text()[-3000:] for p in (tmp_path / "logs").glob("*.log")}
    assert codes == [0, 0], (codes, logs)
    assert Manifest.read(tmp_path / "run" / "ep0-ba2").world_size == 2
    expected = torch.load(tmp_path / "out" / "run.rank0.pt", weights_only=True)["model"]
    got = cli(
        "export",
        "--format",
        "safetensors",
        "--max-shard-size",
        "10KB",
        str(tmp_path / "run"),
        str(tmp_path / "hf"),
    )
    assert got.returncode == 0, got.stderr
    assert_bitwise(read_safetensors_folder(tmp_path / "hf"), expected)
    got = cli("export", "--format", "dcp", str(tmp_path / "run"), str(tmp_path / "dcp"))
    assert got.returncode == 0, got.stderr
    assert_bitwise(read_dcp_folder(tmp_path / "dcp", expected), expected)


@pytest.fixture
def s3_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The project's local S3 server, boto3's environment pointed at it (skipped without one
    outside CI, as the objectstore suite does)."""
    from tools.s3server import S3Server, ServerUnavailableError

    try:
        server = S3Server(tmp_path / "s3server").start()
    except ServerUnavailableError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"no S3 server in CI: {exc}")
        pytest.skip(f"no S3 server: {exc}")
    for name in ("AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN", "S3_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    yield server
    server.stop()


@pytest.mark.objectstore
def test_an_s3_run_folder_exports_to_both_folder_formats(tmp_path, s3_server):
    run_uri = f"s3://{s3_server.bucket}/exports/run"
    model, opt, sched, _ = make()
    ck = CheckpointManager(
        model=model,
        optimizer=opt,
        folder=run_uri,
        local_folder=tmp_path / "local",
        run_name="run",
        interval="1ba",
    )
    step(model, opt, sched)
    ck.batch_end(4)
    ck.close()
    expected = saved_weights(tmp_path / "local" / "ep0-ba1")
    got = cli("export", "--format", "safetensors", run_uri, str(tmp_path / "hf"))
    assert got.returncode == 0, got.stderr
    assert f"{run_uri}/ep0-ba1" in got.stdout
    assert_bitwise(read_safetensors_folder(tmp_path / "hf"), expected)
    got = cli(
        "export", "--format", "dcp", "--dtype", "bf16", f"{run_uri}/ep0-ba1", str(tmp_path / "dcp")
    )
    assert got.returncode == 0, got.stderr
    bf16 = cast(expected, torch.bfloat16)
    assert_bitwise(read_dcp_folder(tmp_path / "dcp", bf16), bf16)


class Noted(torch.nn.Linear):
    """A layer with non-tensor state of its own (as TransformerEngine's layers have)."""

    def get_extra_state(self):
        return "calibrated"

    def set_extra_state(self, state):
        self.note = state


def test_non_tensor_model_entries_are_left_out_of_folders_and_named(tmp_path, capsys):
    torch.manual_seed(0)
    model = torch.nn.Sequential(Noted(4, 4), torch.nn.Linear(4, 2))
    ck = CheckpointManager(model=model, folder=tmp_path / "ck", run_name="run", interval="1ba")
    ck.batch_end(1)
    ck.close()
    expected = {k: v for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    assert (
        cli_main(["export", "--format", "safetensors", str(tmp_path / "ck"), str(tmp_path / "hf")])
        == 0
    )
    err = capsys.readouterr().err
    assert "left out 1 model entries that are not tensors (0._extra_state)" in err, err
    assert_bitwise(read_safetensors_folder(tmp_path / "hf"), expected)
    done = export_checkpoint(tmp_path / "ck", tmp_path / "dcp", fmt="dcp")
    assert done.left_out == ["0._extra_state"]
    assert_bitwise(read_dcp_folder(tmp_path / "dcp", expected), expected)
    export_checkpoint(tmp_path / "ck", tmp_path / "w.pt")
    assert torch.load(tmp_path / "w.pt", weights_only=True)["0._extra_state"] == "calibrated"


def test_without_the_safetensors_package_the_message_says_what_to_install(
    ckpt, tmp_path, monkeypatch, capsys
):
    from trainer_runtime import cli as cli_mod
    from trainer_runtime import export as export_mod

    assert cli_mod._export_formats() == export_mod.FORMATS  # the CLI's copy, kept in step
    monkeypatch.setitem(sys.modules, "safetensors", None)  # import safetensors fails
    assert cli_main(["export", "--format", "safetensors", str(ckpt), str(tmp_path / "hf")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--format safetensors needs the safetensors package" in line
    assert "resumable-training[export]" in line
    assert cli_main(["export", "--format", "dcp", str(ckpt), str(tmp_path / "dcp")]) == 0
