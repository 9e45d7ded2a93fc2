"""How a benchmark ends when Ctrl-C stops it: one line and exit status 130, not a traceback.

Each benchmark cleans up on the way out (its data folder, its rank processes, its cluster);
``KeyboardInterrupt`` still reached the interpreter after that and printed a traceback that
looked like a crash. 130 is what a shell reports for a command ended by SIGINT (128 + 2).

Ctrl-C reaches every process of the terminal's foreground group, the benchmark's rank and
relaunched-resume children included, and a child spends seconds importing torch before its
``main`` runs. So importing this module (first, before torch) makes Ctrl-C during the imports end
the process at once and quietly: nothing exists yet to clean up. ``run`` then hands Ctrl-C back
to Python (``KeyboardInterrupt``), so the ``finally`` blocks of ``main`` clean up.
No torch import here: the operator benchmarks use it too.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

INTERRUPTED_EXIT = 130
LINE = "[bench] interrupted (Ctrl-C)"


def _exit_now(signum: int, frame: FrameType | None) -> NoReturn:
    os.write(2, f"{LINE}\n".encode())
    os._exit(INTERRUPTED_EXIT)


# Only where Ctrl-C would raise KeyboardInterrupt: a benchmark started with SIGINT ignored (in
# the background of a non-interactive shell) keeps ignoring it.
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _exit_now)


def run(main: Callable[[], int | None]) -> NoReturn:
    """Run a benchmark's ``main`` and exit with its status (0 for ``None``); Ctrl-C exits 130
    with one line on stderr, after the clean-up that ``main``'s own ``finally`` blocks did."""
    if signal.getsignal(signal.SIGINT) is _exit_now:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        status = main()
    except BaseException as exc:
        if not caused_by_ctrl_c(exc):
            raise
        print(LINE, file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_EXIT) from None
    raise SystemExit(status or 0)


def caused_by_ctrl_c(exc: BaseException) -> bool:
    """``KeyboardInterrupt``, an error raised while one was being handled, or a failed DCP save
    or load whose ranks Ctrl-C broke.

    ``torch.save`` interrupted inside its zip writer raises a ``RuntimeError`` ("unexpected
    pos") from the writer's clean-up, which replaces the interrupt. DCP catches each rank's
    ``KeyboardInterrupt`` and raises a ``CheckpointException`` that holds it in ``failures``
    (rank: (exception, stack)), neither cause nor context."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        at = todo.pop()
        if id(at) in seen:
            continue
        seen.add(id(at))
        if isinstance(at, KeyboardInterrupt):
            return True
        todo += [e for e in (at.__cause__, at.__context__) if e is not None]
        todo += _wrapped_failures(at)
    return False


def _wrapped_failures(exc: BaseException) -> list[BaseException]:
    """The per-rank exceptions of a DCP ``CheckpointException``, without importing torch."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict):
        return []
    found = []
    for wrapped in failures.values():
        first = wrapped[0] if isinstance(wrapped, tuple) and wrapped else wrapped
        if isinstance(first, BaseException):
            found.append(first)
    return found
