"""The few lines a user must see whatever the script does with ``logging``.

What the runtime decided at start (resumed from which checkpoint, passing over which, or
started fresh) and what it did on SIGTERM (saved what, how fast) are the facts a user checks
first when a job misbehaves. As plain ``logging`` records they were invisible in most real
training scripts: nanoGPT and the PyTorch FSDP2 example configure no logging, so INFO records go
nowhere, and a script that sets WARNING hides them too. So these lines reach stderr either way:

* through ``logging`` when a handler is configured and the level lets the record through (the
  application's format, file and filters apply; no line printed twice);
* else written to stderr as ``rtj: <message>``.

The structured ``rtj-event`` lines (``events.py``) carry the same facts for tools; these are the
human lines. Only the process with local rank 0 speaks: one line per pod, not one per GPU.
(Rejected: adding a handler to the package's logger: it would print every INFO record of the
runtime, and twice once the application configures a root handler.)
"""

from __future__ import annotations

import contextlib
import logging
import sys

PREFIX = "rtj: "


def announce(logger: logging.Logger, level: int, msg: str, *args: object, speak: bool) -> None:
    """Log ``msg % args``; when no configured handler would show it, write it to stderr.

    ``speak``: this process is the one that reports (local rank 0); the others only log.
    """
    if not speak or (logger.isEnabledFor(level) and logger.hasHandlers()):
        logger.log(level, msg, *args, stacklevel=2)
        return
    text = msg % args if args else msg
    with contextlib.suppress(OSError, ValueError):  # a closed stderr must not stop training
        sys.stderr.write(PREFIX + text + "\n")
        sys.stderr.flush()
