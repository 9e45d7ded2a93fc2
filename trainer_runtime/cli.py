"""``rtj-checkpoints``: look at a run folder from a shell (what exists, what verifies), and
export a checkpoint's weights as a plain ``state_dict`` file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import CheckpointError
from .layout import RunFolder


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rtj-checkpoints", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, text in (
        ("ls", "list checkpoints, newest first"),
        ("verify", "check every file of every committed checkpoint"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("folder", type=Path, help="a run folder (holds latest.json)")
    exp = sub.add_parser(
        "export",
        help="write a checkpoint's model weights as a plain state_dict file "
        "(torch.load(path, weights_only=True) reads it)",
    )
    exp.add_argument("folder", type=Path, help="a checkpoint folder, or a run folder (its newest)")
    exp.add_argument("out", type=Path, help="the .pt file to write")
    exp.add_argument(
        "--trusted-pickle", action="store_true", help="the checkpoint was saved with trusted_pickle"
    )
    args = ap.parse_args(argv)
    if not args.folder.is_dir():
        print(f"rtj-checkpoints: {args.folder} is not a folder", file=sys.stderr)
        return 2
    if args.cmd == "export":
        return _export(args.folder, args.out, trusted=args.trusted_pickle)
    return _list(args.folder, verify=args.cmd == "verify")


def _export(folder: Path, out: Path, *, trusted: bool) -> int:
    from .export import export_weights  # noqa: PLC0415 - torch only for this command

    try:
        ckpt = export_weights(folder, out, trusted=trusted)
    except CheckpointError as exc:
        print(f"rtj-checkpoints: {exc}", file=sys.stderr)
        return 1
    print(f"exported the model weights of {ckpt} to {out}")
    return 0


def _list(root: Path, *, verify: bool) -> int:
    folder = RunFolder(root)
    pointer = folder.pointer_name()
    bad = 0
    for cand in folder.candidates():
        m = cand.manifest
        if m is None:
            print(f"  {cand.name:28s} NOT COMMITTED  {cand.reason}")
            continue
        ts = m.timestamp
        status = ""
        if verify:
            reason = folder.verify(m, list(range(m.world_size)))
            status = "ok" if reason is None else f"BROKEN: {reason}"
            bad += reason is not None
        mark = "*" if cand.name == pointer else " "
        print(
            f"{mark} {cand.name:28s} epoch {ts.epoch} batch {ts.batch} sample {ts.sample} "
            f"ranks {m.world_size} {m.created_at} {status}".rstrip()
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
