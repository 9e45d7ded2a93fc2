"""Writing model weights as a Hugging Face-style folder of sharded safetensors files.

The layout is the one ``transformers`` and most inference servers read:
``model-00001-of-0000N.safetensors`` files of at most ``--max-shard-size`` bytes each (a tensor
larger than that gets a file of its own), and ``model.safetensors.index.json`` mapping every
tensor to its file, with the total size.

A safetensors file is an 8-byte header length, a JSON header (each tensor's dtype, shape and
byte range) and the tensors' bytes, back to back. Everything the header holds is known before
any tensor is read (``export_source`` lists names, dtypes and shapes), so each file is written
header first and then tensor by tensor, from reads of a few hundred MB at a time: the export
holds one read batch in memory, not a file's worth. ``safetensors.torch.save_file`` was
rejected for writing: it takes a dict of the whole file's tensors and copies them into one
bytes object first, about twice the file size in memory (10 GB at the default 5 GB). The
library still checks every file written: ``safe_open`` parses its header with the reference
implementation and the tensors it lists must be the ones planned.
"""

from __future__ import annotations

import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError
from .source import READ_BATCH_BYTES, BatchedReads, TensorEntry, WeightSource

INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_SIZE = "5GB"

_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
for _torch_name, _st_name in (
    ("float8_e4m3fn", "F8_E4M3"),
    ("float8_e5m2", "F8_E5M2"),
    ("uint16", "U16"),
    ("uint32", "U32"),
    ("uint64", "U64"),
):
    if hasattr(torch, _torch_name):  # newer torch only
        _DTYPE_NAMES[getattr(torch, _torch_name)] = _st_name

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(text: str, *, option: str = "--max-shard-size") -> int:
    """Bytes in ``text``: a plain number of bytes, or a number with KB, MB, GB, TB (powers of
    1000, as Hugging Face counts) or KiB, MiB, GiB, TiB (powers of 1024); case does not
    matter. A ``ConfigError`` that names ``option`` otherwise."""
    m = _SIZE.fullmatch(text)
    unit = _UNITS.get(m.group(2).lower()) if m else None
    if m is None or unit is None:
        raise ConfigError(
            f"{option}={text!r}: expected a size in bytes, or a number with KB, MB, GB, TB "
            "(powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), e.g. 5GB or 500MiB"
        )
    size = int(float(m.group(1)) * unit)
    if size < 1:
        raise ConfigError(f"{option}={text!r}: expected a size of at least one byte")
    return size


def require_library() -> None:
    """Raise a ``ConfigError`` saying how to install safetensors when it is missing."""
    try:
        import safetensors  # noqa: F401, PLC0415
    except ImportError as exc:
        raise ConfigError(
            "--format safetensors needs the safetensors package: "
            "pip install 'resumable-training[export]' (or pip install safetensors)"
        ) from exc


def check_dtypes(entries: list[TensorEntry]) -> None:
    bad = [f"{e.name} ({e.dtype})" for e in entries if e.dtype not in _DTYPE_NAMES]
    if bad:
        raise ConfigError(
            "--format safetensors: no safetensors dtype for "
            + ", ".join(bad[:5])
            + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            + "; use --format dcp or pt"
        )


def plan_shards(entries: list[TensorEntry], max_bytes: int) -> list[list[TensorEntry]]:
    """The tensors of each file, in order: a file takes tensors until the next one would take
    it past ``max_bytes``; a tensor larger than that is a file of its own."""
    shards: list[list[TensorEntry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards if shards[0] else []


def shard_name(index: int, count: int) -> str:
    return f"model-{index + 1:05d}-of-{count:05d}.safetensors"


@dataclass(frozen=True)
class Written:
    files: list[str]
    total_bytes: int


def write_folder(
    source: WeightSource,
    folder: Path,
    *,
    max_shard_size: int,
    read_batch: int = READ_BATCH_BYTES,
) -> Written:
    """Write ``source``'s tensors into the (new, empty) ``folder``: the shards, then the index.
    Files are fsynced; the caller makes the folder itself appear."""
    require_library()
    check_dtypes(source.entries)
    shards = plan_shards(source.entries, max_shard_size)
    if not shards:
        raise ConfigError("--format safetensors: the checkpoint's model holds no tensor")
    names = [shard_name(i, len(shards)) for i in range(len(shards))]
    reads = BatchedReads(source, [e.name for shard in shards for e in shard], budget=read_batch)
    weight_map: dict[str, str] = {}
    for name, shard in zip(names, shards, strict=True):
        _write_file(folder / name, shard, reads)
        _check_file(folder / name, shard)
        weight_map.update((e.name, name) for e in shard)
    total = source.total_bytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(folder / INDEX_NAME, "x", encoding="utf-8") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return Written(files=[*names, INDEX_NAME], total_bytes=total)


def _header(shard: list[TensorEntry]) -> bytes:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}  # transformers checks it
    at = 0
    for e in shard:
        header[e.name] = {
            "dtype": _DTYPE_NAMES[e.dtype],
            "shape": list(e.shape),
            "data_offsets": [at, at + e.nbytes],
        }
        at += e.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the tensors' bytes start 8-aligned, as the library writes
    return struct.pack("<Q", len(blob)) + blob


def _write_file(path: Path, shard: list[TensorEntry], reads: BatchedReads) -> None:
    with open(path, "xb") as f:
        f.write(_header(shard))
        for e in shard:
            t = reads.take(e.name)
            f.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            del t
        f.flush()
        os.fsync(f.fileno())


def _check_file(path: Path, shard: list[TensorEntry]) -> None:
    """The reference reader parses the file's header and finds the tensors planned."""
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(path), framework="pt") as f:
        found = set(f.keys())
        for e in shard:
            if e.name not in found or tuple(f.get_slice(e.name).get_shape()) != e.shape:
                raise OSError(f"{path.name}: safetensors does not read back {e.name!r} as written")
    if len(found) != len(shard):
        raise OSError(f"{path.name}: safetensors lists {len(found)} tensors, {len(shard)} written")
