"""Exporting a checkpoint's model weights as a plain ``state_dict`` file.

A rank file holds much more than weights (optimizer, RNG, data position, runtime bookkeeping)
in the runtime's own layout. For inference, fine-tuning elsewhere or sharing, people want what
``torch.save(model.state_dict(), path)`` would have written: ``rtj-checkpoints export`` (and
``export_weights``) write exactly that, from a checkpoint whose files verify in full (a named
checkpoint as well as a run folder's newest), so
``model.load_state_dict(torch.load(path, weights_only=True))`` works on the plain model.
The checkpoint's format reader (``resume/formats.reader_for``) reads the weights (its
``read_model``), and this module never asks which format it holds: for format version 1, rank
0's file (model weights are replicated across data-parallel ranks; ``resume/per_rank_format``);
for version 2 (sharded), full, unsharded tensors from every data file, each chunk's digest
checked as it is read, only the ``model`` entries (``resume/sharded_format``).

``export_checkpoint`` writes the other formats, folders of files other tools read:
``safetensors`` (Hugging Face's sharded layout, ``export_safetensors``) and ``dcp`` (stock
``torch.distributed.checkpoint``, ``export_dcp``), tensor by tensor from reads of a few hundred
MB (``open_source``), so that a model larger than one machine's memory still exports. A folder
is written under a temporary name beside ``OUT`` and renamed onto it only when every file is on
disk: a folder named ``OUT`` is always a complete export. (Writing into ``OUT`` directly, with a
marker file last, was rejected: a reader that does not know the marker, ``transformers`` or
``dcp.load``, would take a half-written folder for a whole one.) docs/export.md tells the
formats apart.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch

from .errors import ConfigError, NoCheckpointError
from .export_formats.source import (
    DTYPES,
    READ_BATCH_BYTES,
    WeightSource,
    cast_dtype,
    open_source,
)
from .resume.formats import reader_for
from .resume.sharded_format import (  # defined with format 2's reader, importable from here too
    read_sharded_weights,  # noqa: F401
)
from .run_folder.layout import RunFolder
from .save import atomic
from .save.manifest import MANIFEST_NAME, Manifest, verify_files

FORMATS = ("pt", "safetensors", "dcp")
"""``--format`` choices: ``pt`` (one ``torch.save`` file, the default) or a folder."""

T = TypeVar("T")


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint folder as given, or a run folder's newest checkpoint that verifies.

    Either way the files that hold the weights (every rank's for version 2, rank 0's for
    version 1) are checked against the manifest in full, as ``rtj-checkpoints verify`` does,
    not only the chunks export reads."""
    if (path / MANIFEST_NAME).exists():
        manifest = Manifest.read(path)
        reason = verify_files(path, manifest, _needed_ranks(manifest))
        if reason is not None:
            raise NoCheckpointError(f"checkpoint {path} does not verify: {reason}")
        return path
    walk = RunFolder(path).newest_valid(_needed_ranks)
    if walk.chosen is None:
        reasons = "; ".join(walk.reasons(lambda m: m.name))
        raise NoCheckpointError(
            f"{str(path)!r} holds no checkpoint whose weights verify"
            + (f" ({reasons})" if reasons else "")
        )
    return path / walk.chosen.name


def _needed_ranks(manifest: Manifest) -> list[int]:
    """Version 2 spreads the weights over every rank's file; version 1 has them in rank 0's
    (each format's reader knows which, ``weight_ranks``)."""
    return reader_for(manifest).weight_ranks(manifest)


def export_weights(
    source: Path, out: Path, *, trusted: bool = False, dtype: str | None = None
) -> Path:
    """Write the model ``state_dict`` of ``source`` (checkpoint or run folder) to ``out``;
    returns the checkpoint folder it came from. ``dtype`` (``bf16``, ``fp16``, ``fp32``): cast
    the floating tensors to it. The whole state dict is in memory at once (``torch.save``
    writes one object)."""
    to = _dtype(dtype)
    ckpt = resolve_checkpoint(Path(source))
    manifest = Manifest.read(ckpt)
    weights = reader_for(manifest).read_model(ckpt, manifest, trusted=trusted)
    if not isinstance(weights, dict) or not weights:
        raise NoCheckpointError(f"checkpoint {ckpt} holds no model weights")
    plain = {k: _plain(v, to) for k, v in weights.items()}
    out = Path(out)
    atomic.makedirs_durable(out.parent.resolve())
    atomic.write_atomic(out, lambda f: torch.save(plain, f))
    return ckpt


def _plain(value: object, to: torch.dtype | None) -> object:
    if not isinstance(value, torch.Tensor):
        return value
    cast = cast_dtype(value.dtype, to)
    if cast != value.dtype:
        return value.to(cast)
    if value.untyped_storage().nbytes() != value.nbytes:  # torch.save writes a whole storage
        return value.clone()
    return value  # read for this export alone: a copy would only double the memory


def _dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    if name not in DTYPES:
        raise ConfigError(f"--dtype={name!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


@dataclass(frozen=True)
class Exported:
    """What ``export_checkpoint`` wrote."""

    checkpoint: Path
    """The checkpoint folder the weights came from."""
    out: Path
    format: str
    files: list[str]
    """The files written: ``OUT`` itself for ``pt``, else the files in the folder ``OUT``."""
    total_bytes: int
    """Bytes of tensor data exported (``pt``: the file's size)."""
    left_out: list[str] = field(default_factory=list)
    """Model entries that are not tensors, which the folder formats cannot hold."""


def export_checkpoint(
    source: Path,
    out: Path,
    *,
    fmt: str = "pt",
    dtype: str | None = None,
    max_shard_size: int | str | None = None,
    trusted: bool = False,
    read_batch: int = READ_BATCH_BYTES,
) -> Exported:
    """Export the model weights of ``source`` (checkpoint or run folder) to ``out`` in format
    ``fmt`` (``FORMATS``). For ``safetensors`` and ``dcp``, ``out`` is a folder that must not
    exist yet or be empty; it appears only complete. ``max_shard_size`` (``safetensors``
    only): bytes, or a text such as ``"5GB"``; default 5GB. ``read_batch``: bytes of weights
    read at a time by the folder formats (the bulk of their memory)."""
    max_bytes = check_options(fmt, dtype, max_shard_size)
    out = Path(out)
    if fmt == "pt":
        ckpt = export_weights(source, out, trusted=trusted, dtype=dtype)
        return Exported(ckpt, out, fmt, [out.name], out.stat().st_size)
    problem = new_folder_problem(str(out), fmt)
    if problem is not None:
        raise ConfigError(problem)
    ckpt = resolve_checkpoint(Path(source))
    weights = open_source(ckpt, Manifest.read(ckpt), trusted=trusted, cast=_dtype(dtype))

    def write(folder: Path) -> list[str]:
        return _write_format(weights, folder, fmt, max_bytes, read_batch)

    files = write_new_folder(out, write)
    return Exported(ckpt, out, fmt, files, weights.total_bytes, left_out=list(weights.others))


def _write_format(
    weights: WeightSource, folder: Path, fmt: str, max_bytes: int | None, read_batch: int
) -> list[str]:
    if fmt == "safetensors":
        from .export_formats import hf_safetensors  # noqa: PLC0415

        assert max_bytes is not None
        written = hf_safetensors.write_folder(
            weights, folder, max_shard_size=max_bytes, read_batch=read_batch
        )
        return written.files
    from .export_formats import dcp  # noqa: PLC0415

    return dcp.write_folder(weights, folder, read_batch=read_batch)


def check_options(fmt: str, dtype: str | None, max_shard_size: int | str | None) -> int | None:
    """``ConfigError`` naming the option for a bad choice; the shard size in bytes for
    ``safetensors`` (else None). Checks what can be checked before any checkpoint is read."""
    from .export_formats import hf_safetensors  # noqa: PLC0415

    if fmt not in FORMATS:
        raise ConfigError(f"--format={fmt!r}: expected one of {', '.join(FORMATS)}")
    _dtype(dtype)
    if fmt != "safetensors":
        if max_shard_size is not None:
            raise ConfigError(
                f"--max-shard-size applies to --format safetensors only, not --format {fmt}"
            )
        return None
    hf_safetensors.require_library()
    if max_shard_size is None:
        max_shard_size = hf_safetensors.DEFAULT_MAX_SHARD_SIZE
    if isinstance(max_shard_size, str):
        return hf_safetensors.parse_size(max_shard_size)
    if (
        isinstance(max_shard_size, bool)
        or not isinstance(max_shard_size, int)
        or (max_shard_size < 1)
    ):
        raise ConfigError(f"--max-shard-size={max_shard_size!r}: expected a positive size")
    return max_shard_size


def new_folder_problem(out: str, fmt: str) -> str | None:
    """Why ``OUT`` cannot be the new folder of a ``fmt`` export, or None: it must be local, and
    new or an empty folder (an export overwrites nothing)."""
    if "://" in out:
        return (
            f"OUT={out!r}: export writes a local folder; give a path such as ./exported "
            "and copy it to the bucket afterwards"
        )
    path = Path(out)
    if path.is_dir():
        if any(path.iterdir()):
            return (
                f"OUT={out!r} is a folder that is not empty; --format {fmt} writes a new "
                "folder and overwrites nothing: give a new or empty folder"
            )
        return None
    if path.exists() or path.is_symlink():
        return f"OUT={out!r} is a file; --format {fmt} writes a folder: give a new folder's path"
    blocker = next((p for p in path.parents if p.exists() or p.is_symlink()), None)
    if blocker is not None and not blocker.is_dir():  # OUT's nearest existing ancestor
        return (
            f"OUT={out!r}: {blocker} is a file, not a folder; "
            "give a path whose folders are folders (or do not exist yet)"
        )
    return None


def write_new_folder(out: Path, write: Callable[[Path], T]) -> T:
    """Run ``write`` on a new folder beside ``out`` (a temporary name that ``atomic.is_temp``
    knows), then rename it onto ``out``, durably: ``out`` appears only complete. On any
    failure, or an interrupt, the temporary folder is removed and ``out`` left as it was."""
    out = Path(os.path.abspath(out))
    atomic.makedirs_durable(out.parent)
    staged = atomic.temp_name(out)
    staged.mkdir()
    try:
        result = write(staged)
        atomic.fsync_dir(staged)
        os.rename(staged, out)  # replaces an empty folder; fails on one that is not empty
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    atomic.fsync_dir(out.parent)
    return result
