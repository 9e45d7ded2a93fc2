"""``rtj-checkpoints``: look at a run folder from a shell (what exists, what verifies), and
export a checkpoint's weights as a plain ``state_dict`` file, a safetensors folder or a DCP
folder (docs/export.md).

Each folder argument may be local or ``s3://BUCKET/PREFIX/...``. A bucket prefix is read through
the runtime's own remote run-folder model (``objectstore.folder``) and verified downloads
(``objectstore.resolver``), with the endpoint and credentials from the same environment
variables as training (docs/object-store.md), so the tool sees what a resume would see.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import CheckpointError
from .resume.rejection import foreign_entry
from .run.config import is_remote
from .run_folder.layout import RunFolder
from .run_folder.names import is_checkpoint_file
from .save.manifest import MANIFEST_NAME, Manifest

if TYPE_CHECKING:
    from .objectstore import S3Store, S3Uri

Check = Callable[[Manifest], str | None]
"""None when every file of a committed checkpoint verifies, else why not."""

_S3_NOTE = "; s3://BUCKET/PREFIX/... works too (downloaded to a temporary folder, then checked)"


EXIT_PIPE_CLOSED = 141
"""The exit status when the reader of the output goes away (``rtj-checkpoints ls | head -1``):
128 + SIGPIPE, what a shell reports for other tools in that case; no traceback."""


def main(argv: list[str] | None = None) -> int:
    try:
        code = _run(argv)
        sys.stdout.flush()  # output still buffered meets a closed pipe here
    except BrokenPipeError:
        # Nothing more can reach the reader; point stdout at /dev/null so that the
        # interpreter's own flush at exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_PIPE_CLOSED
    return code


def _run(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "export":
        problem = _export_problem(args)
        if problem is not None:  # before anything is downloaded or read
            print(f"rtj-checkpoints: {problem}", file=sys.stderr)
            return 2
        args.out = Path(args.out)
    if _is_s3(args.folder) or is_remote(args.folder):  # others: training's error and hint
        return _main_remote(args)
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f"rtj-checkpoints: {folder} is not a folder", file=sys.stderr)
        return 2
    if args.cmd == "export":
        return _export(folder, args)
    only = None
    if (folder / MANIFEST_NAME).is_file() or _uncommitted_checkpoint(folder):
        folder, only = _split_checkpoint(folder)  # that checkpoint alone
    run = RunFolder(folder)
    check = (lambda m: run.verify(m, list(range(m.world_size)))) if args.cmd == "verify" else None
    return _list(run, check, only=only, foreign=lambda name: foreign_entry(folder / name))


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rtj-checkpoints", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, text in (
        ("ls", "list checkpoints, newest first"),
        ("verify", "check every file of every committed checkpoint"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument(
            "folder", metavar="FOLDER", help="a run folder (holds latest.json)" + _S3_NOTE
        )
    exp = sub.add_parser(
        "export",
        help="write a checkpoint's model weights as a plain state_dict file "
        "(torch.load(path, weights_only=True) reads it), a safetensors folder or a DCP folder",
        description="Write a checkpoint's model weights in a standard format (docs/export.md). "
        "pt: one torch.save file of the state_dict; safetensors: a Hugging Face-style folder "
        "of sharded .safetensors files and model.safetensors.index.json; dcp: a folder that "
        "torch.distributed.checkpoint.load reads with FileSystemReader. The folder formats "
        "read and write a few hundred MB at a time, not the whole model.",
    )
    exp.add_argument(
        "folder",
        metavar="FOLDER",
        help="a checkpoint folder, or a run folder (its newest)" + _S3_NOTE,
    )
    exp.add_argument(
        "out",
        metavar="OUT",
        help="the local .pt file to write (--format pt), or the new (or empty) local folder "
        "to create (safetensors, dcp)",
    )
    exp.add_argument(
        "--format",
        choices=_export_formats(),
        default="pt",
        help="what to write (default: pt)",
    )
    exp.add_argument(
        "--dtype",
        choices=("bf16", "fp16", "fp32"),
        help="cast floating tensors to this dtype (integer and boolean ones keep theirs); "
        "default: as saved",
    )
    exp.add_argument(
        "--max-shard-size",
        metavar="SIZE",
        help="--format safetensors: the most bytes of tensors in one file, as bytes or with "
        "KB/MB/GB (powers of 1000) or KiB/MiB/GiB (powers of 1024); default 5GB",
    )
    exp.add_argument(
        "--trusted-pickle", action="store_true", help="the checkpoint was saved with trusted_pickle"
    )
    return ap


def _export_formats() -> tuple[str, ...]:
    return ("pt", "safetensors", "dcp")  # export.FORMATS, without importing torch for ls


def _export_problem(args: argparse.Namespace) -> str | None:
    """Why ``export`` with these options cannot run (options, OUT), or None."""
    if args.format == "pt" and args.max_shard_size is None:
        return _unwritable_out(args.out)
    from .errors import ConfigError  # noqa: PLC0415
    from .export import check_options, new_folder_problem  # noqa: PLC0415 - imports torch

    try:
        args.max_shard_bytes = check_options(args.format, args.dtype, args.max_shard_size)
    except ConfigError as exc:
        return str(exc)
    return new_folder_problem(args.out, args.format)


def _unwritable_out(out: str) -> str | None:
    """Why ``export`` cannot write ``out``, or None. ``Path`` would turn ``s3://b/w.pt`` into
    the local ``s3:/b/w.pt`` without a word, and a folder, or a path under a regular file
    (``out.txt/w.pt``), only failed after the download."""
    if "://" in out:
        return (
            f"OUT={out!r}: export writes a local file; give a path such as weights.pt "
            "and copy it to the bucket afterwards"
        )
    if Path(out).is_dir():
        return f"OUT={out!r} is a folder; give the file to write, e.g. {Path(out) / 'weights.pt'}"
    blocker = next((p for p in Path(out).parents if p.exists() or p.is_symlink()), None)
    if blocker is not None and not blocker.is_dir():  # OUT's nearest existing ancestor
        return (
            f"OUT={out!r}: {blocker} is a file, not a folder; "
            "give a path whose folders are folders (or do not exist yet)"
        )
    return None


def _split_checkpoint(folder: Path) -> tuple[Path, str]:
    """A checkpoint folder's run folder and name, the run folder as the user wrote it
    (``ck/ep0-ba2`` gives ``ck``), so what is printed names the path they gave; resolved only
    when the path has no name of its own (``.``, ``..``) or is a link (``ck/latest-rank0``
    names the checkpoint it points to)."""
    if folder.name in ("", ".", ".."):
        folder = folder.resolve()
    elif folder.is_symlink():
        real = folder.resolve()
        if real.parent != folder.parent.resolve():  # a checkpoint in another folder
            return real.parent, real.name
        return folder.parent, real.name
    return folder.parent, folder.name


def _uncommitted_checkpoint(folder: Path) -> bool:
    """A folder of checkpoint files without a manifest (a save cut short): shown as such,
    where reading it as a run folder printed nothing, and ``verify`` passed."""
    return any(folder.iterdir()) and foreign_entry(folder) is None


def _is_s3(text: str) -> bool:
    from .objectstore.uri import is_s3_uri  # noqa: PLC0415 - no object-store import otherwise

    return is_s3_uri(text)


def _export(folder: Path, args: argparse.Namespace, *, shown: str | None = None) -> int:
    from .export import export_checkpoint  # noqa: PLC0415 - torch only for this command

    out: Path = args.out
    try:
        done = export_checkpoint(
            folder,
            out,
            fmt=args.format,
            dtype=args.dtype,
            max_shard_size=getattr(args, "max_shard_bytes", None),
            trusted=args.trusted_pickle,
        )
    except CheckpointError as exc:
        print(f"rtj-checkpoints: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a local file that cannot be read, or OUT written (disk full, ...)
        print(f"rtj-checkpoints: export to {out} failed: {exc}", file=sys.stderr)
        return 1
    if done.left_out:
        names = ", ".join(done.left_out[:5]) + (" ..." if len(done.left_out) > 5 else "")
        print(
            f"rtj-checkpoints: left out {len(done.left_out)} model entries that are not "
            f"tensors ({names}): --format {args.format} holds tensors only, --format pt "
            "keeps them",
            file=sys.stderr,
        )
    detail = ""
    if args.format != "pt":
        data = [f for f in done.files if not f.endswith(".json") and not f.startswith(".")]
        files = f"{len(data)} data file" + ("s" if len(data) != 1 else "")
        detail = f" ({args.format}: {files}, {done.total_bytes} bytes of tensors"
        detail += f", floating tensors as {args.dtype})" if args.dtype else ")"
    elif args.dtype:
        detail = f" (floating tensors as {args.dtype})"
    print(f"exported the model weights of {shown or done.checkpoint} to {out}{detail}")
    return 0


def _list(
    folder: RunFolder,
    check: Check | None,
    *,
    only: str | None = None,
    foreign: Callable[[str], str | None] | None = None,
) -> int:
    """Print the run folder's checkpoints, newest first (or only the one named ``only``); with
    ``check``, whether each verifies. ``foreign``: what in a folder without a manifest no save
    writes (a local folder of the user's, ``tb_logs/``), which makes it no checkpoint."""
    pointer = folder.pointer_name()
    bad = 0
    for cand in folder.candidates():
        if only is not None and cand.name != only:
            continue
        m = cand.manifest
        if m is None and foreign is not None and foreign(cand.name) is not None:
            continue  # not a checkpoint, as for resume (which leaves it alone)
        if m is None:
            if check is not None and cand.damaged:  # a commit's manifest that no longer reads
                print(f"  {cand.name:28s} BROKEN: {cand.reason}")
                bad += 1
                continue
            print(f"  {cand.name:28s} NOT COMMITTED  {cand.reason}")
            bad += check is not None and only is not None  # the checkpoint asked about
            continue
        ts = m.timestamp
        status = ""
        if check is not None:
            reason = check(m)
            status = "ok" if reason is None else f"BROKEN: {reason}"
            bad += reason is not None
        mark = "*" if cand.name == pointer else " "
        print(
            f"{mark} {cand.name:28s} epoch {ts.epoch} batch {ts.batch} sample {ts.sample} "
            f"ranks {m.world_size} {m.created_at} {status}".rstrip()
        )
    return 1 if bad else 0


# ---------------------------------------------------------------------- s3://


def _main_remote(args: argparse.Namespace) -> int:
    """The same commands on a bucket prefix. Exit 2: unusable location (malformed URI,
    missing bucket, refused credentials, unreachable endpoint) or a prefix with no object
    under it (a local folder that does not exist); 1: a broken checkpoint, none to export, or
    a store failure midway."""
    from .objectstore import ObjectStoreConfigError, ObjectStoreError, open_store  # noqa: PLC0415

    try:
        store, uri = open_store(args.folder, arg="FOLDER", write=False)  # as in the usage line
    except (ValueError, ObjectStoreConfigError) as exc:
        print(f"rtj-checkpoints: {exc}", file=sys.stderr)
        return 2
    try:
        if next(store.list_objects(uri), None) is None:  # S3 has no empty folders
            print(f"rtj-checkpoints: {uri} is not a folder (no object under it)", file=sys.stderr)
            return 2
        if args.cmd == "export":
            return _export_remote(store, uri, args)
        if uri.key and (
            store.head(uri.join(MANIFEST_NAME)) is not None
            or _uncommitted_remote_checkpoint(store, uri)
        ):  # a checkpoint
            return _list_remote(store, uri.parent(), verify=args.cmd == "verify", only=uri.name)
        return _list_remote(store, uri, verify=args.cmd == "verify")
    except ObjectStoreError as exc:
        print(f"rtj-checkpoints: {exc}", file=sys.stderr)
        return 1


def _uncommitted_remote_checkpoint(store: S3Store, uri: S3Uri) -> bool:
    """Objects under ``uri`` that are all checkpoint files, directly in it, without a
    manifest: a checkpoint not committed (as ``_uncommitted_checkpoint`` locally). One
    listing, ended at the first object that is not a checkpoint file."""
    found = False
    for name in _remote_entries(store, uri):
        if _foreign_name(name):
            return False
        found = True
    return found


def _foreign_remote(store: S3Store, uri: S3Uri) -> str | None:
    """The first object under ``uri`` that no upload puts into a checkpoint folder (one in a
    subfolder, a file of another kind), as ``rejection.foreign_entry`` locally."""
    return next((n for n in _remote_entries(store, uri) if _foreign_name(n)), None)


def _remote_entries(store: S3Store, uri: S3Uri) -> Iterator[str]:
    """The entries under ``uri`` as a local listing names them: ``<sub>/`` for an object in a
    subfolder, else the object's name."""
    for info in store.list_objects(uri):
        name = info.uri.key[len(uri.prefix) :]
        yield name.split("/", 1)[0] + "/" if "/" in name else name


def _foreign_name(entry: str) -> bool:
    return entry.endswith("/") or not is_checkpoint_file(entry)


def _list_remote(store: S3Store, run_uri: S3Uri, *, verify: bool, only: str | None = None) -> int:
    from .objectstore import remote_run_folder  # noqa: PLC0415

    folder = remote_run_folder(store, run_uri)

    def foreign(name: str) -> str | None:
        return _foreign_remote(store, run_uri.join(name))

    if not verify:
        return _list(folder, None, only=only, foreign=foreign)
    return _list(
        folder,
        lambda m: folder.verify(m, None) or _download_check(store, run_uri, m),
        only=only,
        foreign=foreign,
    )


def _download_check(store: S3Store, run_uri: S3Uri, manifest: Manifest) -> str | None:
    """Every byte of the checkpoint checked by a verified download into a temporary folder
    (deleted after): the object metadata a HEAD shows cannot reveal damaged bytes."""
    from .objectstore import (  # noqa: PLC0415
        ChecksumMismatchError,
        ObjectNotFoundError,
        RemoteCheckpoint,
        download_checkpoint,
    )

    remote = RemoteCheckpoint(run_uri.join(manifest.name), manifest)
    with tempfile.TemporaryDirectory(prefix="rtj-verify-") as scratch:
        try:
            download_checkpoint(store, remote, scratch)
        except (ChecksumMismatchError, ObjectNotFoundError) as exc:
            return str(exc)
    return None


def _export_remote(store: S3Store, uri: S3Uri, args: argparse.Namespace) -> int:
    """Download the checkpoint ``uri`` (or the newest of the run folder ``uri`` that downloads
    intact), verified, into a temporary folder, and export that."""
    from .objectstore import download_checkpoint, resume_from_remote  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="rtj-export-") as scratch:
        if uri.key and store.head(uri.join(MANIFEST_NAME)) is not None:
            ckpt, local = uri, download_checkpoint(store, uri, scratch)
        else:
            found = resume_from_remote(store, uri, scratch)  # raises if none downloads intact
            if found is None:
                print(f"rtj-checkpoints: folder {uri} holds no checkpoint", file=sys.stderr)
                return 1
            ckpt, local = found[0].uri, found[1]
        return _export(local, args, shown=str(ckpt))


if __name__ == "__main__":
    sys.exit(main())
