"""``load_path`` in the object store: what it holds decides what loads, and nothing is an error
of the same type as for a local path (docs/runtime.md, Errors)."""

from __future__ import annotations

import io

import pytest
import torch

from trainer_runtime import CheckpointManager, NoCheckpointError
from trainer_runtime.objectstore import S3Store

from ..unit.trainkit import make, params, step

pytestmark = pytest.mark.objectstore


def fine_tune(tmp_path, load_path, **kw):
    comps = make(seed=7)
    ck = CheckpointManager(
        model=comps[0], folder=tmp_path / "ft", run_name="ft", load_path=load_path, **kw
    )
    return comps, ck


def uploaded_run(tmp_path, s3_root):
    """One committed checkpoint uploaded under ``<s3_root>/src``; returns the components."""
    comps = make()
    ck = CheckpointManager(
        model=comps[0],
        optimizer=comps[1],
        folder=f"{s3_root}/{{run_name}}",
        local_folder=tmp_path / "node",
        run_name="src",
        interval="1ba",
    )
    ck.resume()
    step(*comps[:3])
    ck.batch_end(4)
    ck.close()
    return comps


def test_a_missing_s3_load_path_is_no_checkpoint_error(tmp_path, s3_root):
    _, ck = fine_tune(tmp_path, f"{s3_root}/nothing-here")
    with pytest.raises(NoCheckpointError, match=r"load_path s3://.*/nothing-here is neither"):
        ck.resume()


def test_an_s3_data_file_of_a_checkpoint_is_a_clear_error(tmp_path, s3_root):
    uploaded_run(tmp_path, s3_root)
    data = f"{s3_root}/src/ep0-ba1/__0_0.distcp"
    comps, ck = fine_tune(tmp_path, data)
    before = params(comps[0])
    with pytest.raises(
        NoCheckpointError, match=r"load_path 's3://.*__0_0\.distcp' is not a torch\.save file"
    ):
        ck.resume()
    assert all(torch.equal(a, b) for a, b in zip(params(comps[0]), before, strict=True))


def test_an_s3_state_dict_object_loads_into_the_model(tmp_path, s3_root):
    source = make(seed=3)
    buf = io.BytesIO()
    torch.save(source[0].state_dict(), buf)
    S3Store().put_bytes(s3_root.join("weights.pt"), buf.getvalue())
    comps, ck = fine_tune(tmp_path, str(s3_root.join("weights.pt")), load_weights_only=True)
    assert ck.resume().source == "load_path"
    assert all(torch.equal(a, b) for a, b in zip(params(comps[0]), params(source[0]), strict=True))
    ck.close(save=False)
