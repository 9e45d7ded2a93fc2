"""A worker: one training process of the pod, forked from the agent or started as a command.

A forked worker inherits the agent's imported modules (torch, the runtime), so what is left of
its start is the training script's own imports and work. The child takes the worker's
environment, restores the default signal dispositions (the runtime installs its own SIGTERM
handler), runs the script or module the way ``python`` would (``runpy``, ``__main__``), runs the
``atexit`` handlers, flushes, and ends with ``os._exit``: unwinding into the agent's frames would
run the agent's own cleanup in the child.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from .command import EXEC, WorkerCommand


@dataclass
class Worker:
    """One running worker: a forked child (``pid``) or a child process (``popen``)."""

    local_rank: int
    pid: int
    popen: subprocess.Popen | None = None
    exit_code: int | None = None

    def poll(self) -> int | None:
        """The exit code once the worker ended (signals as 128 + signal number), else None."""
        if self.exit_code is not None:
            return self.exit_code
        if self.popen is not None:
            code = self.popen.poll()
            if code is not None:
                self.exit_code = 128 - code if code < 0 else code
            return self.exit_code
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.exit_code = 1
            return self.exit_code
        if pid == 0:
            return None
        self.exit_code = os.waitstatus_to_exitcode(status)
        if self.exit_code < 0:
            self.exit_code = 128 - self.exit_code
        return self.exit_code

    def signal(self, signum: int) -> None:
        if self.exit_code is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


def start(command: WorkerCommand, environ: Mapping[str, str], local_rank: int) -> Worker:
    """Start one worker with exactly ``environ`` as its environment."""
    if command.mode == EXEC:
        popen = subprocess.Popen(command.argv, env=dict(environ))
        return Worker(local_rank, popen.pid, popen)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns from here
        _run_forked(command, environ)
    return Worker(local_rank, pid)


def _run_forked(command: WorkerCommand, environ: Mapping[str, str]) -> None:
    code = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(environ)
        from ..resume import warm_start  # noqa: PLC0415 - the agent imported it; now with our env

        warm_start.start_in_forked_worker()
        sys.argv = command.argv
        code = _run(command)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        # What the interpreter does with an uncaught exception: the runtime's hook may wait for
        # the gang's new membership first (save/survivor.py)
        sys.excepthook(*sys.exc_info())
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):  # a closed stream: nothing left to say
                    stream.flush()
            os._exit(code)


def _run(command: WorkerCommand) -> int:
    if command.module:
        sys.path.insert(0, os.getcwd())
        runpy.run_module(command.target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(command.target)))
        runpy.run_path(command.target, run_name="__main__")
    return 0


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1
