"""A rank that resumes a format-version-1 checkpoint with ``elastic=True`` at a new world size,
then writes the first numbers its torch generator draws (``<out>/draws.rank<r>.json``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from tests.unit.trainkit import make, manager


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True, help="holds ck/, the run folder")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    ck = manager(Path(args.root), make(seed=7), elastic=True)
    result = ck.resume()
    draws = torch.rand(4).tolist()
    out = Path(args.out) / f"draws.rank{dist.get_rank()}.json"
    out.write_text(json.dumps({"resumed": result.path, "draws": draws}))
    ck.close(save=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
