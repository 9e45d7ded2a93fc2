"""The manager's settings: constructor arguments and environment, read and validated once.

``CheckpointManager`` used to check its arguments and read ``RTJ_*`` variables at whatever
point it first needed each one, so a bad value could surface mid-run. ``Settings.resolve``
does it all at construction; every error names the argument or environment variable and what
was expected. Explicit arguments win over the environment. Where the run lives is settled here
too (``locate_run``: a local folder, or an ``s3://`` one staged locally and uploaded;
``check_run_folder``: writable and not another run's), before the first step. (Rejected: a
pydantic model; the runtime keeps its dependencies to torch, xxhash and, for s3://, boto3.)
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from . import envvars, naming
from .atomic import makedirs_durable, write_bytes_atomic
from .errors import ConfigError, OverwriteError
from .timestamp import IntervalFn, SaveInterval

if TYPE_CHECKING:
    from .layout import RunFolder
    from .remote import RemoteBackend

AsyncPolicy = Literal["wait", "skip"]
DEFAULT_GRACE_PERIOD_S = 30.0


def env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


@dataclass(frozen=True)
class Settings:
    """Validated settings; see ``CheckpointManager`` for what each one does."""

    interval: SaveInterval
    templates: naming.NameTemplates
    run_name: str | None
    """None: not given (a throwaway run gets a generated, agreed name)."""
    num_checkpoints_to_keep: int
    weights_only: bool
    overwrite: bool
    autoresume: bool
    resume_from: str | None
    load_path: str | None
    load_weights_only: bool
    load_strict: bool
    load_ignore_keys: tuple[str, ...]
    async_save: bool
    async_policy: AsyncPolicy
    trusted_pickle: bool
    quarantined: frozenset[str]
    data_skip_steps: int
    ignore_data_position: bool
    elastic: bool
    global_batch_size: int | None
    notice_file: str | None
    grace_period_s: float
    upload_flush_timeout_s: float | None
    final_save: bool

    @classmethod
    def resolve(
        cls,
        *,
        folder: Any,
        filename: str,
        latest_filename: str | None,
        run_name: str | None,
        interval: int | str | IntervalFn,
        num_checkpoints_to_keep: int,
        weights_only: bool,
        overwrite: bool,
        autoresume: bool,
        resume_from: str | None,
        load_path: str | None,
        load_weights_only: bool,
        load_strict: bool,
        load_ignore_keys: Sequence[str],
        async_save: bool,
        async_policy: str,
        trusted_pickle: bool,
        quarantined: Iterable[str] | None,
        data_skip_steps: int,
        sampler_batch_size: int | None,
        has_sampler: bool,
        ignore_data_position: bool,
        elastic: bool,
        global_batch_size: int | None,
        notice_file: str | None,
        grace_period_s: float | None,
        upload_flush_timeout_s: float | None,
        final_save: bool,
    ) -> Settings:
        if num_checkpoints_to_keep == 0 or num_checkpoints_to_keep < -1:
            raise ConfigError(
                f"num_checkpoints_to_keep={num_checkpoints_to_keep!r}: expected -1 (keep all) "
                "or a positive count"
            )
        if data_skip_steps < 0:
            raise ConfigError(f"data_skip_steps={data_skip_steps!r}: expected >= 0")
        if data_skip_steps and (not has_sampler or sampler_batch_size is None):
            raise ConfigError(
                "data_skip_steps needs sampler=ResumableSampler(..., batch_size=per-rank size)"
            )
        if global_batch_size is not None and global_batch_size < 1:
            raise ConfigError(f"global_batch_size={global_batch_size!r}: expected >= 1")
        if upload_flush_timeout_s is not None and not upload_flush_timeout_s >= 0:
            raise ConfigError(
                f"upload_flush_timeout_s={upload_flush_timeout_s!r}: expected seconds >= 0 "
                "(or None for the default)"
            )
        if async_policy not in ("wait", "skip"):
            raise ConfigError(f"async_policy={async_policy!r}: expected 'wait' or 'skip'")
        root = env(envvars.CHECKPOINT_DIR)
        if folder is None and root:
            folder_template = f"{root.rstrip('/')}/{{run_name}}"
        else:
            folder_template = naming.DEFAULT_FOLDER if folder is None else str(folder)
        templates = naming.NameTemplates(
            folder=folder_template, filename=filename, latest_filename=latest_filename
        )
        name = run_name or env(envvars.RUN_NAME)
        if name is None and autoresume:
            raise ConfigError(
                "autoresume needs a stable run_name: pass run_name=... or set "
                f"{envvars.RUN_NAME} (or autoresume=False for a throwaway run)"
            )
        if name is not None and ("/" in name or not name.strip()):
            raise ConfigError(f"run_name={name!r} must be a non-empty name without '/'")
        env_quarantine = (env(envvars.QUARANTINED) or "").split(",")
        return cls(
            interval=SaveInterval.parse(interval),
            templates=templates,
            run_name=name,
            num_checkpoints_to_keep=num_checkpoints_to_keep,
            weights_only=weights_only,
            overwrite=overwrite,
            autoresume=autoresume,
            resume_from=resume_from or env(envvars.RESUME_FROM),
            load_path=load_path,
            load_weights_only=load_weights_only,
            load_strict=load_strict,
            load_ignore_keys=tuple(load_ignore_keys),
            async_save=async_save,
            async_policy=async_policy,  # type: ignore[arg-type]
            trusted_pickle=trusted_pickle,
            quarantined=frozenset(
                q.strip().rstrip("/").rsplit("/", 1)[-1]
                for q in [*(quarantined or ()), *env_quarantine]
                if q.strip()
            ),
            data_skip_steps=data_skip_steps,
            ignore_data_position=ignore_data_position,
            elastic=elastic,
            global_batch_size=global_batch_size,
            notice_file=notice_file or env(envvars.NOTICE_FILE),
            grace_period_s=_grace_period(grace_period_s),
            upload_flush_timeout_s=upload_flush_timeout_s,
            final_save=final_save,
        )


def _grace_period(given: float | None) -> float:
    if given is not None:
        if not (isinstance(given, int | float) and math.isfinite(given) and given > 0):
            raise ConfigError(f"grace_period_s={given!r}: expected seconds > 0")
        return float(given)
    raw = env(envvars.GRACE_PERIOD_SECONDS)
    if raw is None:
        return DEFAULT_GRACE_PERIOD_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(
            f"{envvars.GRACE_PERIOD_SECONDS}={raw!r}: expected seconds > 0 (the pod's "
            "terminationGracePeriodSeconds)"
        )
    return value


# ---------------------------------------------------------------------- the run's location
def is_remote(location: str) -> bool:
    return "://" in location


def locate_run(
    rendered_folder: str,
    *,
    remote: RemoteBackend | None,
    local_folder: str | os.PathLike[str] | None,
    rank: int,
    world_size: int,
    keep_local: int | None,
    keep_remote: int,
) -> tuple[Path, RemoteBackend | None]:
    """The local run folder and the object store behind it (``folder="s3://..."`` builds
    one; a bad URI, bucket or credentials fail here, at once)."""
    if not is_remote(rendered_folder):
        return Path(rendered_folder), remote
    if remote is not None:
        raise ConfigError("pass either an s3:// folder or remote=..., not both")
    run_dir = _staging_dir(rendered_folder, local_folder)
    root, _, leaf = rendered_folder.rstrip("/").rpartition("/")
    if not leaf or root.endswith(":/"):
        raise ConfigError(
            f"folder={rendered_folder!r}: expected s3://bucket/prefix/{{run_name}} (a run "
            "folder inside a bucket)"
        )
    from .objectstore.backend import S3Backend  # noqa: PLC0415 - boto3 only for s3://

    try:
        backend = S3Backend(
            root,
            leaf,
            arg="folder",
            rank=rank,
            world_size=world_size,
            keep_local=keep_local,
            keep_remote=keep_remote,
        )
    except ConfigError:
        raise  # ObjectStoreConfigError: bucket, credentials, endpoint (named in the message)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return run_dir, backend


def _staging_dir(run_uri: str, local_folder: str | os.PathLike[str] | None) -> Path:
    """Where checkpoints of an s3:// run are committed locally before upload."""
    if local_folder is not None:
        return Path(local_folder)
    base = env(envvars.LOCAL_CHECKPOINT_DIR) or os.path.join(
        tempfile.gettempdir(), "rtj-checkpoints"
    )
    scheme, _, rest = run_uri.partition("://")
    return Path(base) / scheme / rest.strip("/")


def check_run_folder(folder: RunFolder, *, run_name: str, rank: int, overwrite: bool) -> None:
    """Fail now, not at the first save, if the folder is unusable or someone else's."""
    run_dir = folder.root
    try:
        makedirs_durable(run_dir)
        probe = run_dir / f".write-probe-{rank}-{os.getpid()}"
        write_bytes_atomic(probe, b"ok")
        probe.unlink()
    except OSError as exc:
        blocker = _file_in_the_way(run_dir)
        if blocker is not None:
            raise ConfigError(
                f"checkpoint folder {str(run_dir)!r} cannot be created: "
                f"{str(blocker)!r} is a file, not a folder; pass folder= a folder path"
            ) from exc
        raise ConfigError(
            f"checkpoint folder {str(run_dir)!r} is not writable: {exc.strerror or exc}"
        ) from exc
    foreign = sorted({m.run_name for m in folder.committed()} - {run_name})
    if foreign and not overwrite:
        raise OverwriteError(
            f"checkpoint folder {str(run_dir)!r} holds checkpoints of other run(s) "
            f"{', '.join(foreign)}; use another folder or run_name, or pass overwrite=True"
        )


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest existing non-folder on the way to ``path`` (itself included), if any."""
    for p in [path, *path.parents]:
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None
