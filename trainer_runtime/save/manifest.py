"""The manifest: the one file whose presence commits a checkpoint.

It is written last, after every rank's file is durable, and lists each file with its size and
xxh3-128 digest. xxh3 rather than sha256 because verifying a multi-GiB checkpoint at resume must
cost little next to reading it; the digest guards against torn and bit-rotted files, not against
an attacker (the object store's own integrity checks and access control cover that).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from ..errors import ManifestError
from ..run_folder.names import MANIFEST_NAME
from ..timestamp import Timestamp

FORMAT = "rtj-checkpoint"
FORMAT_VERSION_PER_RANK = 1
"""One ``rank{N}.pt`` per rank, each a full ``torch.save`` of that rank's state."""
FORMAT_VERSION_SHARDED = 2
"""A torch.distributed.checkpoint folder: ``__{rank}_0.distcp`` data files, one ``.metadata``
(see ``trainer_runtime/sharded``); replicated state written once, loadable at any world size."""
FORMAT_VERSION = FORMAT_VERSION_PER_RANK
"""The version a manifest gets when its writer names none."""
READABLE_VERSIONS = (FORMAT_VERSION_PER_RANK, FORMAT_VERSION_SHARDED)
_CHUNK = 8 << 20


@dataclass(frozen=True)
class FileEntry:
    path: str
    """Relative to the checkpoint folder."""
    rank: int
    size: int
    xxh3_128: str


@dataclass
class Manifest:
    name: str
    run_name: str
    world_size: int
    timestamp: Timestamp
    files: list[FileEntry]
    weights_only: bool = False
    created_at: str = ""
    save_duration_s: float = 0.0
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def sharded(self) -> bool:
        """True for a DCP checkpoint, where any rank may read any rank's file."""
        return self.format_version == FORMAT_VERSION_SHARDED

    def files_for_rank(self, rank: int) -> list[FileEntry]:
        return [f for f in self.files if f.rank == rank]

    def to_json(self) -> str:
        data = asdict(self)
        data["timestamp"] = self.timestamp.to_dict()
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "manifest") -> Manifest:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{source} is not valid JSON: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ManifestError(f"{source} is not a {FORMAT} manifest")
        version = data.get("format_version")
        if version not in READABLE_VERSIONS:
            raise ManifestError(
                f"{source} has format_version {version!r}; this runtime reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}"
            )
        try:
            files = [FileEntry(**f) for f in data["files"]]
            manifest = cls(
                name=str(data["name"]),
                run_name=str(data["run_name"]),
                world_size=int(data["world_size"]),
                timestamp=Timestamp.from_dict(data["timestamp"]),
                files=files,
                weights_only=bool(data.get("weights_only", False)),
                created_at=str(data.get("created_at", "")),
                save_duration_s=float(data.get("save_duration_s", 0.0)),
                extra=dict(data.get("extra", {})),
                format_version=int(version),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"{source} is missing or has a malformed field: {exc}") from exc
        ranks = {f.rank for f in files}
        if ranks != set(range(manifest.world_size)):
            raise ManifestError(
                f"{source} lists files for ranks {sorted(ranks)} but world_size is "
                f"{manifest.world_size}"
            )
        return manifest

    @classmethod
    def read(cls, checkpoint_dir: Path) -> Manifest:
        path = checkpoint_dir / MANIFEST_NAME
        try:
            text = path.read_bytes()
        except FileNotFoundError as exc:
            raise ManifestError(f"{path} does not exist (checkpoint not committed)") from exc
        except OSError as exc:
            raise ManifestError(f"{path} cannot be read: {exc}") from exc
        return cls.from_json(text, source=str(path))


def new_hasher() -> Any:
    return xxhash.xxh3_128()


def hash_file(path: Path) -> tuple[int, str]:
    """(size, xxh3-128 hex digest) of a file, read once in large chunks."""
    h = new_hasher()
    size = 0
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return size, h.hexdigest()


def wrong_size(file: object, found: int, expected: int, *, where: str = "") -> str:
    """The one wording for a file whose size is not its manifest's: the file, the size found
    (``where``: " remotely", ...), the size expected. The caller names the checkpoint, once."""
    return f"{file} has {found} bytes{where}, expected {expected} (its size in the manifest)"


def entry_label(entry: FileEntry) -> str:
    """A manifest entry as messages name it: its path in the checkpoint and its rank."""
    return f"{entry.path} (rank {entry.rank})"


def size_problem(checkpoint_dir: Path, entry: FileEntry) -> str | None:
    """None when the file exists with its entry's size, else the reason (no byte is read)."""
    try:
        size = os.stat(checkpoint_dir / entry.path).st_size
    except FileNotFoundError:
        return f"{entry_label(entry)} is missing"
    if size != entry.size:
        return wrong_size(entry_label(entry), size, entry.size)
    return None


def verify_files(checkpoint_dir: Path, manifest: Manifest, ranks: list[int] | None) -> str | None:
    """None when every file of ``ranks`` (None: all) in ``checkpoint_dir`` matches its entry,
    else the first file's reason."""
    for entry in manifest.files:
        if ranks is None or entry.rank in ranks:
            reason = verify_entry(checkpoint_dir, entry)
            if reason:
                return reason
    return None


def verify_entry(checkpoint_dir: Path, entry: FileEntry) -> str | None:
    """None when the file matches its entry, else a reason fit for a log line."""
    problem = size_problem(checkpoint_dir, entry)
    if problem is not None:
        return problem
    _, digest = hash_file(checkpoint_dir / entry.path)
    if digest != entry.xxh3_128:
        return f"{entry_label(entry)} fails its checksum"
    return None
