"""The manager's settings: constructor arguments and environment, read and validated once.

``CheckpointManager`` used to check its arguments and read ``RTJ_*`` variables at whatever
point it first needed each one, so a bad value could surface mid-run. ``Settings.resolve``
does it all at construction; every error names the argument or environment variable and what
was expected. Explicit arguments win over the environment. (Rejected: a pydantic model; the
runtime keeps its dependencies to torch, xxhash and, for s3://, boto3.)
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from . import envvars, naming
from .errors import ConfigError
from .timestamp import IntervalFn, SaveInterval

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
