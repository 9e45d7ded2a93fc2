"""How a benchmark ends when Ctrl-C stops it: one line and exit status 130, not a traceback.

Each benchmark cleans up on the way out (its data folder, its rank processes, its cluster);
``KeyboardInterrupt`` still reached the interpreter after that and printed a traceback that
looked like a crash. 130 is what a shell reports for a command ended by SIGINT (128 + 2).
No torch import here: the operator benchmarks use it too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

INTERRUPTED_EXIT = 130


def run(main: Callable[[], int | None]) -> NoReturn:
    """Run a benchmark's ``main`` and exit with its status (0 for ``None``); Ctrl-C exits 130
    with one line on stderr, after the clean-up that ``main``'s own ``finally`` blocks did."""
    try:
        status = main()
    except KeyboardInterrupt:
        print("[bench] interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        raise SystemExit(INTERRUPTED_EXIT) from None
    raise SystemExit(status or 0)
