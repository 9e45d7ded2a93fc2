"""Exporting a checkpoint's model weights as a plain ``state_dict`` file.

A rank file holds much more than weights (optimizer, RNG, data position, runtime bookkeeping)
in the runtime's own layout. For inference, fine-tuning elsewhere or sharing, people want what
``torch.save(model.state_dict(), path)`` would have written: ``rtj-checkpoints export`` (and
``export_weights``) write exactly that, from a checkpoint whose files verify in full (a named
checkpoint as well as a run folder's newest), so
``model.load_state_dict(torch.load(path, weights_only=True))`` works on the plain model.
For a format-version-1 checkpoint, model weights are replicated across data-parallel ranks,
so rank 0's file is the source. For version 2 (sharded), the model's tensors are read from
every data file through ``VerifyingReader`` (each chunk's digest checked as it is read) into
full, unsharded tensors, in the manner of DCP's ``dcp_to_torch_save``: only the ``model``
entries are read, never the optimizer state or the pickled per-rank state.
"""

from __future__ import annotations

from pathlib import Path

import torch

from . import atomic
from .errors import CorruptCheckpointError, ManifestError, NoCheckpointError
from .layout import RunFolder
from .manifest import MANIFEST_NAME, Manifest, verify_files
from .serialization import load_file
from .sharded.checkpointer import check_files_present


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
    """Version 2 spreads the weights over every rank's file; version 1 has them in rank 0's."""
    return list(range(manifest.world_size)) if manifest.sharded else [0]


def _read_rank0_weights(ckpt: Path, manifest: Manifest, *, trusted: bool) -> object:
    entries = manifest.files_for_rank(0)
    if not entries:
        raise ManifestError(f"{ckpt}/{MANIFEST_NAME} lists no file for rank 0")
    data = load_file(ckpt / entries[0].path, trusted=trusted)
    return data.get("state", {}).get("model")


def read_sharded_weights(ckpt: Path, manifest: Manifest, *, trusted: bool = False) -> object:
    """The full (unsharded) model ``state_dict`` of a version-2 checkpoint, one process.

    Every chunk read is checked against its digest; a damaged one raises
    ``CorruptCheckpointError``.
    """
    from torch.distributed.checkpoint.api import CheckpointException  # noqa: PLC0415
    from torch.distributed.checkpoint.default_planner import (  # noqa: PLC0415
        _EmptyStateDictLoadPlanner,
    )
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict  # noqa: PLC0415

    from .dist import describe_failures  # noqa: PLC0415
    from .sharded.keys import MODEL_KEY  # noqa: PLC0415
    from .sharded.reading import VerifyingReader  # noqa: PLC0415
    from .sharded.storage import METADATA_NAME  # noqa: PLC0415

    problem = check_files_present(ckpt, manifest)
    if problem is not None:
        raise NoCheckpointError(f"checkpoint {ckpt} is incomplete: {problem}")
    meta = next((f for f in manifest.files if f.path == METADATA_NAME), None)
    if meta is None:
        raise ManifestError(f"{ckpt}/{MANIFEST_NAME} lists no {METADATA_NAME}")
    state: dict = {}
    try:
        _load_state_dict(
            state,
            storage_reader=VerifyingReader(ckpt, expected_metadata=meta, trusted=trusted),
            planner=_EmptyStateDictLoadPlanner(keys={MODEL_KEY}),
            no_dist=True,
        )
    except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
        cause = (
            describe_failures(exc)  # one line, without DCP's traceback per rank
            if isinstance(exc, CheckpointException) and exc.failures
            else f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        )
        raise CorruptCheckpointError(f"checkpoint {ckpt}: {cause}") from exc
    return state.get(MODEL_KEY)


def export_weights(source: Path, out: Path, *, trusted: bool = False) -> Path:
    """Write the model ``state_dict`` of ``source`` (checkpoint or run folder) to ``out``;
    returns the checkpoint folder it came from."""
    ckpt = resolve_checkpoint(Path(source))
    manifest = Manifest.read(ckpt)
    weights = (
        read_sharded_weights(ckpt, manifest, trusted=trusted)
        if manifest.sharded
        else _read_rank0_weights(ckpt, manifest, trusted=trusted)
    )
    if not isinstance(weights, dict) or not weights:
        raise NoCheckpointError(f"checkpoint {ckpt} holds no model weights")
    plain = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in weights.items()}
    out = Path(out)
    atomic.makedirs_durable(out.parent.resolve())
    atomic.write_atomic(out, lambda f: torch.save(plain, f))
    return ckpt
