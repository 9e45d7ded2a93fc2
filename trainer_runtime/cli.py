"""``rtj-checkpoints``: look at a run folder from a shell (what exists, what verifies)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
    args = ap.parse_args(argv)
    folder = RunFolder(args.folder)
    if not args.folder.is_dir():
        print(f"rtj-checkpoints: {args.folder} is not a folder", file=sys.stderr)
        return 2
    pointer = (folder.read_pointer() or {}).get("checkpoint")
    bad = 0
    for cand in folder.candidates():
        m = cand.manifest
        if m is None:
            print(f"  {cand.name:28s} NOT COMMITTED  {cand.reason}")
            continue
        ts = m.timestamp
        status = ""
        if args.cmd == "verify":
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
