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

import logging
import math
import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .. import envvars
from ..errors import ConfigError, OverwriteError
from ..pod.preemption import DEFAULT_EXIT_CODE
from ..save import naming
from ..save.atomic import makedirs_durable, write_bytes_atomic
from ..save.auto_interval import AutoIntervalOptions
from ..shutdown import exit_margin
from ..timestamp import IntervalFn, SaveInterval
from . import arguments

if TYPE_CHECKING:
    from ..remote import RemoteBackend
    from ..run_folder.layout import RunFolder
    from ..save.manifest import Manifest

log = logging.getLogger(__name__)

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
    folder_arg: str
    """Where the folder came from, for messages: ``folder`` or ``RTJ_CHECKPOINT_DIR``."""
    run_name: str | None
    """None: not given (a throwaway run gets a generated, agreed name)."""
    num_checkpoints_to_keep: int
    num_local_checkpoints_to_keep: int | None
    num_remote_checkpoints_to_keep: int
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
    handle_sigterm: bool
    notice_file: str | None
    grace_period_s: float
    preemption_exit_code: int
    upload_flush_timeout_s: float | None
    final_save: bool
    coordination_timeout: timedelta
    in_process_switch: bool = False
    """Switch to a new membership in the running process when the agent asks (switch.py)."""
    auto_interval: AutoIntervalOptions | None = None
    """Bounds of ``interval="auto"``; None for any other interval."""
    total_steps: int | None = None
    """The job's total steps: ``total_steps=`` or ``RTJ_TOTAL_STEPS`` (None: unknown)."""
    epochs: int | None = None
    """The job's epochs, for a total of ``epochs * steps_per_epoch``."""
    steps_per_epoch: int | None = None
    """Steps in one epoch (None: learned at the first epoch's end)."""

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
        num_local_checkpoints_to_keep: int | None,
        num_remote_checkpoints_to_keep: int,
        weights_only: bool,
        overwrite: bool,
        autoresume: bool,
        resume_from: str | None,
        load_path: str | os.PathLike[str] | None,
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
        handle_sigterm: bool,
        notice_file: str | None,
        grace_period_s: float | None,
        preemption_exit_code: int,
        upload_flush_timeout_s: float | None,
        final_save: bool,
        coordination_timeout: timedelta,
        in_process_switch: bool = False,
        interval_min: float | timedelta | None = None,
        interval_max: float | timedelta | None = None,
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
    ) -> Settings:
        """The constructor's arguments (and the environment where they are left unset),
        validated: a ``ConfigError`` names the first argument that is wrong.

        Long on purpose: it is the table of settings, one line per argument in the signature
        and one where it is checked into its field, in the order the errors are reported;
        each check with more than a line is a function of its own (``_folder_template``,
        ``_schedule``, ``_grace_period``...).
        """
        flags = {
            "weights_only": weights_only,
            "overwrite": overwrite,
            "autoresume": autoresume,
            "load_weights_only": load_weights_only,
            "load_strict": load_strict,
            "async_save": async_save,
            "trusted_pickle": trusted_pickle,
            "ignore_data_position": ignore_data_position,
            "elastic": elastic,
            "handle_sigterm": handle_sigterm,
            "final_save": final_save,
            "in_process_switch": in_process_switch,
        }
        for flag_name, value in flags.items():
            arguments.flag(flag_name, value)
        data_skip_steps = arguments.integer(
            "data_skip_steps", data_skip_steps, "a number of steps >= 0", lambda n: n >= 0
        )
        if data_skip_steps and (not has_sampler or sampler_batch_size is None):
            raise ConfigError(
                "data_skip_steps needs sampler=ResumableSampler(..., batch_size=per-rank size)"
            )
        if async_policy not in ("wait", "skip"):
            raise ConfigError(f"async_policy={async_policy!r}: expected 'wait' or 'skip'")
        folder_template, folder_arg = _folder_template(folder)
        keep_local, keep_remote = _object_store_retention(
            num_local_checkpoints_to_keep, num_remote_checkpoints_to_keep, folder_template
        )
        name = _run_name(run_name, autoresume=autoresume)
        schedule, auto = _schedule(interval, interval_min, interval_max)
        return cls(
            interval=schedule,
            auto_interval=auto,
            total_steps=_total_steps(total_steps),
            epochs=arguments.optional_integer("epochs", epochs, "an epoch count >= 1", _positive),
            steps_per_epoch=arguments.optional_integer(
                "steps_per_epoch", steps_per_epoch, "a step count >= 1", _positive
            ),
            templates=naming.NameTemplates(
                folder=folder_template, filename=filename, latest_filename=latest_filename
            ),
            folder_arg=folder_arg,
            run_name=name,
            num_checkpoints_to_keep=arguments.integer(
                "num_checkpoints_to_keep",
                num_checkpoints_to_keep,
                "-1 (keep all) or a positive count",
                lambda n: n == -1 or n >= 1,
            ),
            num_local_checkpoints_to_keep=keep_local,
            num_remote_checkpoints_to_keep=keep_remote,
            weights_only=weights_only,
            overwrite=overwrite,
            autoresume=autoresume,
            resume_from=_resume_from(resume_from) or env(envvars.RESUME_FROM),
            load_path=_load_path(load_path),
            load_weights_only=load_weights_only,
            load_strict=load_strict,
            load_ignore_keys=arguments.names("load_ignore_keys", load_ignore_keys, "key prefixes"),
            async_save=async_save,
            async_policy=async_policy,  # type: ignore[arg-type]
            trusted_pickle=trusted_pickle,
            quarantined=_quarantined(quarantined),
            data_skip_steps=data_skip_steps,
            ignore_data_position=ignore_data_position,
            elastic=elastic,
            global_batch_size=arguments.optional_integer(
                "global_batch_size", global_batch_size, "a batch size >= 1", lambda n: n >= 1
            ),
            handle_sigterm=handle_sigterm,
            notice_file=_notice_file(notice_file),
            grace_period_s=_grace_period(grace_period_s, handle_sigterm=handle_sigterm),
            preemption_exit_code=arguments.integer(
                "preemption_exit_code",
                preemption_exit_code,
                f"an exit status 0-255 (default {DEFAULT_EXIT_CODE}: 128 + SIGTERM)",
                lambda n: 0 <= n <= 255,
            ),
            upload_flush_timeout_s=_upload_flush_timeout(upload_flush_timeout_s),
            final_save=final_save,
            coordination_timeout=arguments.duration("coordination_timeout", coordination_timeout),
            in_process_switch=in_process_switch,
        )


AUTO = "auto"
"""``interval="auto"``: the Young-Daly interval from measured save costs (save/auto_interval.py)."""


def _schedule(
    interval: int | str | IntervalFn,
    interval_min: float | timedelta | None,
    interval_max: float | timedelta | None,
) -> tuple[SaveInterval, AutoIntervalOptions | None]:
    """``interval`` as a ``SaveInterval``, with ``interval="auto"``'s bounds (None for any
    other interval, which ``interval_min``/``interval_max`` must then not be given for)."""
    if isinstance(interval, str) and interval.strip() == AUTO:
        return SaveInterval("fn", fn=_auto_decides), AutoIntervalOptions.resolve(
            interval_min, interval_max
        )
    if interval_min is not None or interval_max is not None:
        raise ConfigError(
            f"interval_min/interval_max bound interval='auto' only; interval={interval!r}"
        )
    return SaveInterval.parse(interval), None


def _auto_decides(now: Any, event: Any) -> bool:
    """The schedule of ``interval="auto"`` as a ``SaveInterval``: never by itself (the manager's
    ``AutoInterval`` decides by time)."""
    return False


def _positive(n: int) -> bool:
    return n >= 1


def _total_steps(total_steps: int | None) -> int | None:
    """``total_steps=``, else ``RTJ_TOTAL_STEPS``, else None; each must be an int >= 1."""
    if total_steps is not None:
        return arguments.integer("total_steps", total_steps, "a step count >= 1", _positive)
    raw = env(envvars.TOTAL_STEPS)
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ConfigError(f"{envvars.TOTAL_STEPS}={raw!r}: expected a whole number of steps >= 1")
    return int(raw)


def _folder_template(folder: Any) -> tuple[str, str]:
    """The run folder's template and the name of what gave it (argument or variable)."""
    if folder is not None:
        if not isinstance(folder, str | os.PathLike) or not os.fspath(folder):
            raise ConfigError(
                f"folder={folder!r}: expected a path or an s3:// URI, got "
                f"{arguments.kind(folder) if not isinstance(folder, str) else 'an empty string'}"
            )
        if is_remote(str(folder)):  # the user's own value in the message, not the rendered one
            check_object_store_uri(str(folder), arg="folder")
        return str(folder), "folder"
    root = env(envvars.CHECKPOINT_DIR)
    if root is None:
        return naming.DEFAULT_FOLDER, "folder"
    if is_remote(root):
        check_object_store_uri(root, arg=envvars.CHECKPOINT_DIR)
    # A plain path, not a template: its braces are literal (they were read as variables and
    # refused under the name "folder", which the user never passed).
    literal = root.rstrip("/").replace("{", "{{").replace("}", "}}")
    return f"{literal}/{{run_name}}", envvars.CHECKPOINT_DIR


REMOTE_BACKEND_METHODS = ("submit", "pending", "find_newest", "fetch", "uri_for", "close")
"""What ``remote=`` must offer (``remote.RemoteBackend``)."""


def check_location_arguments(local_folder: object, remote: object) -> None:
    """``local_folder`` and ``remote`` are first used deep in ``locate_run`` and at the first
    upload, where a wrong type failed as a bare ``TypeError`` or ``AttributeError``
    (``remote=3``: "'int' object has no attribute 'uri_for'"), and ``local_folder=""`` staged
    an ``s3://`` run in the working directory. Checked here, whatever the folder."""
    if local_folder is not None:
        if not isinstance(local_folder, str | os.PathLike) or isinstance(
            os.fspath(local_folder), bytes
        ):
            raise ConfigError(
                f"local_folder={local_folder!r}: expected None or a folder path (str or "
                f"os.PathLike), got {arguments.kind(local_folder)}"
            )
        if not os.fspath(local_folder).strip():
            raise ConfigError(
                f"local_folder={local_folder!r}: expected None or a folder path, got an empty "
                "string"
            )
        if is_remote(os.fspath(local_folder)):  # Path() would make a local folder named "s3:"
            raise ConfigError(
                f"local_folder={os.fspath(local_folder)!r}: expected None or a folder on the "
                "local disk (where an s3:// run commits its checkpoints before uploading them); "
                "the bucket goes in folder= or RTJ_CHECKPOINT_DIR"
            )
    if remote is not None:
        missing = [m for m in REMOTE_BACKEND_METHODS if not callable(getattr(remote, m, None))]
        if missing:
            raise ConfigError(
                f"remote={remote!r}: expected None or an object-store backend with "
                f"{', '.join(REMOTE_BACKEND_METHODS)} (trainer_runtime.remote.RemoteBackend), "
                f"got {arguments.kind(remote)} without {', '.join(missing)}; for S3 pass "
                "folder='s3://bucket/prefix/{run_name}' instead"
            )


def _run_name(given: str | None, *, autoresume: bool) -> str | None:
    arg, name = ("run_name", given) if given else (envvars.RUN_NAME, env(envvars.RUN_NAME))
    if name is None:
        if autoresume:
            raise ConfigError(
                "autoresume needs a stable run_name: pass run_name=... or set "
                f"{envvars.RUN_NAME} (or autoresume=False for a throwaway run)"
            )
        return None
    if not isinstance(name, str) or "/" in name or not name.strip():
        raise ConfigError(f"{arg}={name!r} must be a non-empty name without '/'")
    if name in (".", "..") or "\0" in name:
        # '.' is the checkpoint folder itself and '..' its parent: the run's checkpoints,
        # retention and rejected/ would land beside other runs' folders.
        raise ConfigError(
            f"{arg}={name!r} must be a non-empty name without '/': not '.' or '..' (the "
            "folder itself or its parent), and without NUL"
        )
    return name


def _object_store_retention(
    keep_local: object, keep_remote: object, folder_template: str
) -> tuple[int | None, int]:
    """Both counts, checked; they only act on an ``s3://`` folder, so elsewhere a value that
    is not the default is logged as ignored (not refused: one script may run with a local
    folder and, in a pod, with an ``s3://`` ``RTJ_CHECKPOINT_DIR``)."""
    local = arguments.optional_integer(
        "num_local_checkpoints_to_keep", keep_local, "a count >= 0", lambda n: n >= 0
    )
    remote = arguments.integer(
        "num_remote_checkpoints_to_keep",
        keep_remote,
        "-1 (keep all) or a positive count",
        lambda n: n == -1 or n >= 1,
    )
    if not is_remote(folder_template):
        given = [f"num_local_checkpoints_to_keep={local}"] if local is not None else []
        given += [f"num_remote_checkpoints_to_keep={remote}"] if remote != -1 else []
        if given:
            log.warning(
                "%s: ignored, the folder %r is not an s3:// folder (num_checkpoints_to_keep "
                "is the retention of a local folder)",
                ", ".join(given),
                folder_template,
            )
    return local, remote


def _resume_from(given: object) -> str | None:
    """A hint: a checkpoint's name or path (logged; the newest valid checkpoint wins)."""
    if given is None or isinstance(given, str):
        return given
    if isinstance(given, os.PathLike):
        return os.fspath(given)  # type: ignore[return-value]
    raise ConfigError(
        f"resume_from={given!r}: expected a checkpoint's name or path, got {arguments.kind(given)}"
    )


def _load_path(given: str | os.PathLike[str] | None) -> str | None:
    if given is None:
        return None
    if not isinstance(given, str | os.PathLike):
        raise ConfigError(
            f"load_path={given!r}: expected a path or an s3:// URI, got {arguments.kind(given)}"
        )
    path = os.fspath(given)
    if is_remote(path):
        check_object_store_uri(path, arg="load_path")
    return path or None


def check_object_store_uri(uri: str, *, arg: str) -> None:
    """A ``ConfigError`` naming ``arg`` unless ``uri`` is a well-formed ``s3://`` location
    (other schemes get a hint: gs://, oci://, s3a://, https://); nothing is contacted."""
    from ..objectstore.uri import parse_s3_uri  # noqa: PLC0415 - the object store on use only

    try:
        parse_s3_uri(uri, arg=arg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _quarantined(given: Iterable[str] | None) -> frozenset[str]:
    """Checkpoint names never to resume from: the argument, else ``RTJ_QUARANTINED``. Each may
    be a name or a path or URI ending in one."""
    if given is None:
        return quarantined_names(env(envvars.QUARANTINED) or "")
    return quarantined_names(arguments.names("quarantined", given, "checkpoint names"))


def quarantined_names(entries: str | Iterable[str]) -> frozenset[str]:
    """The checkpoint names in ``entries`` (a comma-separated text, as in ``RTJ_QUARANTINED``,
    or a list), each given as a name or a path or URI ending in one."""
    items = entries.split(",") if isinstance(entries, str) else entries
    return frozenset(
        entry.strip().rstrip("/").rsplit("/", 1)[-1] for entry in items if entry.strip()
    )


def _notice_file(given: str | os.PathLike[str] | None) -> str | None:
    """The notice file's path: the argument, else ``RTJ_NOTICE_FILE``. It may not exist yet
    (the notice is written when the node is about to go), but it may not be a folder: a file
    inside one is what gets written, and a folder would never be read as a notice."""
    from_argument = given not in (None, "")
    name = "notice_file" if from_argument else envvars.NOTICE_FILE
    value = given if from_argument else env(envvars.NOTICE_FILE)
    if value is None or value == "":
        return None
    if not isinstance(value, str | os.PathLike):
        raise ConfigError(f"{name}={value!r}: expected a file path (str or os.PathLike)")
    path = os.fspath(value)
    if os.path.isdir(path):
        raise ConfigError(
            f"{name}={path!r} is a folder: expected the notice file's path (the file the "
            "operator's downward-API volume projects, e.g. /etc/resumable/preemption-notice)"
        )
    return path


def _upload_flush_timeout(given: float | None) -> float | None:
    if given is None:
        return None
    return arguments.seconds(
        "upload_flush_timeout_s",
        given,
        "seconds >= 0 (or None for the default)",
        lambda s: s >= 0,
    )


def _grace_period(given: float | None, *, handle_sigterm: bool) -> float:
    """The grace period, from the argument, else ``RTJ_GRACE_PERIOD_SECONDS``, else 30 s."""
    if given is not None:
        value = arguments.seconds(
            "grace_period_s", given, "seconds > 0", lambda s: math.isfinite(s) and s > 0
        )
        source = f"grace_period_s={given}"
    else:
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
        source = f"{envvars.GRACE_PERIOD_SECONDS}={raw}"
    margin = exit_margin(value)
    if handle_sigterm and value <= margin:
        log.warning(
            "%s: a grace period at or below the emergency path's %.1f s margin leaves no time "
            "for the emergency save after SIGTERM (the exit deadline is the grace period minus "
            "the margin, here the signal itself): it is still tried, but the process is ended "
            "with the preemption exit code at that deadline; give more than %.1f s (the pod's "
            "terminationGracePeriodSeconds)",
            source,
            margin,
            margin,
        )
    return value


# ---------------------------------------------------------------------- the run's location
_MISTYPED_URI = re.compile(r"^(?:s3[an]?|gs|gcs|oci|https?):(?!//)", re.IGNORECASE)
"""``s3:/bucket/x``, ``s3:bucket``: an object-store location with a slash missing. Read as a
local path it would put the checkpoints in a folder named ``s3:`` on the node's disk, lost
with the node; it is refused as a malformed URI instead."""


def is_remote(location: str) -> bool:
    """Whether ``location`` asks for the object store (a URI, or one mistyped)."""
    return "://" in location or _MISTYPED_URI.match(location) is not None


def locate_run(
    rendered_folder: str,
    *,
    remote: RemoteBackend | None,
    local_folder: str | os.PathLike[str] | None,
    rank: int,
    world_size: int,
    keep_local: int | None,
    keep_remote: int,
    arg: str = "folder",
) -> tuple[Path, RemoteBackend | None]:
    """The local run folder and the object store behind it (``folder="s3://..."`` builds
    one; a bad URI, bucket or credentials fail here, at once). ``arg`` names where the folder
    came from in messages (``folder``, or ``RTJ_CHECKPOINT_DIR``)."""
    if not is_remote(rendered_folder):
        if local_folder is not None:
            log.warning(
                "local_folder=%r: ignored, the folder %r is not an s3:// folder (local_folder "
                "is where an s3:// run commits its checkpoints before uploading them)",
                os.fspath(local_folder),
                rendered_folder,
            )
        return Path(rendered_folder), remote
    if remote is not None:
        raise ConfigError(f"pass either an s3:// {arg} or remote=..., not both")
    run_dir = _staging_dir(rendered_folder, local_folder)
    root, _, leaf = rendered_folder.rstrip("/").rpartition("/")
    if not leaf or root.endswith(":/"):
        raise ConfigError(
            f"{arg}={rendered_folder!r}: expected s3://bucket/prefix/{{run_name}} (a run "
            "folder inside a bucket)"
        )
    from ..objectstore.backend import S3Backend  # noqa: PLC0415 - boto3 only for s3://

    try:
        backend = S3Backend(
            root,
            leaf,
            arg=arg,
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


def _staging_dir(
    run_uri: str,
    local_folder: str | os.PathLike[str] | None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """Where checkpoints of an s3:// run are committed locally before upload
    (``RTJ_LOCAL_CHECKPOINT_DIR`` read from ``environ``, the process's by default)."""
    if local_folder is not None:
        return Path(local_folder)
    source = os.environ if environ is None else environ
    base = source.get(envvars.LOCAL_CHECKPOINT_DIR, "").strip() or os.path.join(
        tempfile.gettempdir(), "rtj-checkpoints"
    )
    if is_remote(base):  # Path() would make a local folder named "s3:"
        raise ConfigError(
            f"{envvars.LOCAL_CHECKPOINT_DIR}={base!r}: expected a folder on the local disk "
            "(where an s3:// run commits its checkpoints before uploading them); the bucket "
            f"goes in folder= or {envvars.CHECKPOINT_DIR}"
        )
    scheme, _, rest = run_uri.partition("://")
    return Path(base) / scheme / rest.strip("/")


def run_folder_source(settings: Settings, local_folder: object) -> str:
    """What chose the run's local folder, for messages: an argument or an environment variable
    (an ``s3://`` run's folder is its staging folder)."""
    if not is_remote(settings.templates.folder):
        return settings.folder_arg
    if local_folder is None and env(envvars.LOCAL_CHECKPOINT_DIR):
        return envvars.LOCAL_CHECKPOINT_DIR
    return "local_folder"


def check_run_folder(
    folder: RunFolder,
    *,
    run_name: str,
    rank: int,
    overwrite: bool,
    source: str = "folder",
    remote: list[Manifest] | None = None,
    remote_uri: str | None = None,
) -> None:
    """Fail now, not at the first save, if the folder is unusable or someone else's. ``source``
    (see ``run_folder_source``) is what the message tells the user to change; ``remote``: the
    object store's committed manifests of the run (at ``remote_uri``), checked like the local
    folder's (a new pod's local folder is empty)."""
    run_dir = folder.root
    if source in (envvars.CHECKPOINT_DIR, envvars.LOCAL_CHECKPOINT_DIR):
        fix = f"set {source} to a writable folder"
    else:
        fix = f"pass {source}= a writable folder"
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
                f"{str(blocker)!r} is a file, not a folder; {fix}"
            ) from exc
        raise ConfigError(
            f"checkpoint folder {str(run_dir)!r} is not writable: {exc.strerror or exc}; {fix}"
        ) from exc
    for where, manifests in ((str(run_dir), folder.committed()), (remote_uri, remote or [])):
        foreign = sorted({m.run_name for m in manifests} - {run_name})
        if foreign and not overwrite:
            raise OverwriteError(
                f"checkpoint folder {where!r} holds checkpoints of other run(s) "
                f"{', '.join(foreign)}; use another folder or run_name, or pass overwrite=True"
            )


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest existing non-folder on the way to ``path`` (itself included), if any."""
    for p in [path, *path.parents]:
        if p.exists() or p.is_symlink():
            return None if p.is_dir() else p
    return None
