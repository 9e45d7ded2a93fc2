"""Checkpoint names as Python format strings, checked when the manager is built.

A typo such as ``{epohc}`` must fail at construction, not an hour later at the first save, so
every template is parsed and test-rendered up front against the variables it may use.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import ConfigError

PROGRESS_VARS = ("epoch", "batch", "sample", "batch_in_epoch", "sample_in_epoch")
RUN_VARS = ("run_name", "world_size")
RANK_VARS = ("rank", "local_rank")
ALL_VARS = (*RUN_VARS, *PROGRESS_VARS, *RANK_VARS)

DEFAULT_FOLDER = "checkpoints/{run_name}"
DEFAULT_FILENAME = "ep{epoch}-ba{batch}/rank{rank}.pt"
DEFAULT_LATEST = "latest-rank{rank}"


def template_fields(arg: str, template: str) -> set[str]:
    """The variable names a template uses; plain names only (no ``{a.b}`` or ``{a[0]}``)."""
    if not isinstance(template, str) or not template:
        raise ConfigError(f"{arg} must be a non-empty format string, got {template!r}")
    names: set[str] = set()
    try:
        for _, field, _, _ in string.Formatter().parse(template):
            if field is None:
                continue
            if not field.isidentifier():
                raise ConfigError(
                    f"{arg}={template!r}: '{{{field}}}' is not a plain variable name; "
                    f"use one of {', '.join(ALL_VARS)}"
                )
            names.add(field)
    except ValueError as exc:
        raise ConfigError(f"{arg}={template!r} is not a valid format string: {exc}") from exc
    return names


def check_template(arg: str, template: str, allowed: Iterable[str]) -> set[str]:
    """Reject unknown variables and bad format specs; returns the variables used."""
    allowed = tuple(allowed)
    used = template_fields(arg, template)
    unknown = sorted(used - set(allowed))
    if unknown:
        raise ConfigError(
            f"{arg}={template!r} uses unknown variable(s) {', '.join(unknown)}; "
            f"allowed here: {', '.join(allowed)}"
        )
    sample = {name: (0 if name not in ("run_name",) else "run") for name in allowed}
    try:
        template.format(**sample)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{arg}={template!r} cannot be rendered: {exc}") from exc
    return used


@dataclass(frozen=True)
class NameTemplates:
    """The three names a save produces: the run folder, each rank's file, the latest link."""

    folder: str = DEFAULT_FOLDER
    filename: str = DEFAULT_FILENAME
    latest_filename: str | None = DEFAULT_LATEST

    def __post_init__(self) -> None:
        check_template("folder", self.folder, ("run_name",))
        check_template("filename", self.filename, ALL_VARS)
        if "/" not in self.filename.strip("/"):
            raise ConfigError(
                f"filename={self.filename!r} must name a file inside a per-checkpoint folder, "
                "for example 'ep{epoch}-ba{batch}/rank{rank}.pt': the folder holds every "
                "rank's file and the manifest that commits them"
            )
        checkpoint_part, file_part = self.filename.strip("/").rsplit("/", 1)
        if "/" in checkpoint_part or checkpoint_part.startswith("."):
            # Resume lists the run folder's own entries: a nested folder (``ep0``) has no
            # manifest of its own and was deleted there as a crashed save's leftover, with
            # the committed checkpoints inside it; a hidden one is never listed at all.
            raise ConfigError(
                f"filename={self.filename!r}: the folder part {checkpoint_part!r} must be one "
                "folder name directly in the run folder (no '/', not starting with '.'), "
                "for example 'ep{epoch}-ba{batch}/rank{rank}.pt'"
            )
        in_checkpoint = template_fields("filename", checkpoint_part)
        if in_checkpoint & set(RANK_VARS):
            raise ConfigError(
                f"filename={self.filename!r}: the folder part {checkpoint_part!r} must be the "
                "same on every rank, so it cannot use {rank} or {local_rank}"
            )
        if not in_checkpoint & set(PROGRESS_VARS):
            raise ConfigError(
                f"filename={self.filename!r}: the folder part {checkpoint_part!r} must use at "
                f"least one progress variable ({', '.join(PROGRESS_VARS)}) so checkpoints differ"
            )
        if "rank" not in template_fields("filename", file_part):
            raise ConfigError(
                f"filename={self.filename!r}: the file part {file_part!r} must use {{rank}} "
                "so ranks do not overwrite each other"
            )
        if self.latest_filename is not None:
            used = check_template("latest_filename", self.latest_filename, ALL_VARS)
            if "/" in self.latest_filename:
                raise ConfigError(
                    f"latest_filename={self.latest_filename!r}: expected a link name in the "
                    "run folder, without '/' (e.g. 'latest-rank{rank}'), or None for no links"
                )
            if "rank" not in used:
                raise ConfigError(
                    f"latest_filename={self.latest_filename!r} must use {{rank}}: "
                    "there is one latest link per rank"
                )

    @property
    def names_each_position(self) -> bool:
        """Whether the checkpoint folder's name uses ``{batch}`` or ``{sample}``, which differ
        at every saved position as long as the loop counts batches and samples; with only
        ``{epoch}`` or the in-epoch counts, two saves can render one name (see
        ``policy.unused_name``)."""
        checkpoint_part = self.filename.strip("/").rsplit("/", 1)[0]
        return bool(template_fields("filename", checkpoint_part) & {"batch", "sample"})

    def render_folder(self, run_name: str) -> str:
        return self.folder.format(run_name=run_name)

    def render_checkpoint(self, values: dict[str, object]) -> tuple[str, str]:
        """(checkpoint folder name, file name inside it) for one rank."""
        rendered = self.filename.strip("/").format(**values)
        checkpoint, file = rendered.rsplit("/", 1)
        return checkpoint, file

    def render_latest(self, values: dict[str, object]) -> str | None:
        return None if self.latest_filename is None else self.latest_filename.format(**values)

    def latest_pattern(self) -> re.Pattern[str] | None:
        """What every name ``latest_filename`` renders matches (any rank, position or world
        size), so the links of ranks a gang no longer has can be told apart from other files
        and links of the run folder; None without links."""
        if self.latest_filename is None:
            return None
        regex = ""
        for literal, field, _, _ in string.Formatter().parse(self.latest_filename):
            regex += re.escape(literal)
            if field is not None:  # every variable but the run name is a count
                regex += ".+?" if field == "run_name" else r"\s*[-+]?\d+"
        return re.compile(regex)
