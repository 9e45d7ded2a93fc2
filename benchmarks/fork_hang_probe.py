"""Does this Python hang a forked child when another thread enters Python at the fork?

CPython up to 3.11.9 (gh-112275, fixed in 3.11.10 and 3.12) can leave the child of ``os.fork()``
hung for good when, at the moment of the fork, another thread holds the interpreter's
thread-state lock: a thread holds it for an instant while it creates its thread state, as
torch's gloo work threads do when they free a collective's tensors. A DataLoader that forks its
workers in a training process meets that (docs/runtime.md, "Data position").

The probe makes the race frequent: two threads start native threads (``pthread_create``) whose
only work is a ctypes callback, so each one enters Python and creates a thread state, while the
main thread forks children that exit at once. A child that has not exited after 2 s is counted
as hung and killed. Run it with the interpreter of your training image:

    python benchmarks/fork_hang_probe.py --forks 20000

It prints one line and exits 1 when a child hung. Linux only (fork, pthreads).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time
import warnings

HUNG_AFTER_S = 2.0
_ENTRY = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


@_ENTRY
def _enter_python(_arg: int | None) -> None:
    """Runs on a native thread Python has never seen: ctypes creates its thread state."""
    return None


def _start_native_threads(stop: threading.Event, entries: list[int]) -> None:
    libc = ctypes.CDLL(None)
    thread_id = ctypes.c_ulong()
    while not stop.is_set():
        if libc.pthread_create(ctypes.byref(thread_id), None, _enter_python, None) == 0:
            libc.pthread_join(thread_id, None)
            entries[0] += 1


def _fork_one() -> bool:
    """Fork a child that exits at once; whether it hung (then it is killed)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    deadline = time.monotonic() + HUNG_AFTER_S
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return True
        time.sleep(0.0005)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--forks", type=int, default=20000, help="children to fork (default 20000)")
    args = ap.parse_args()
    if args.forks < 1:
        ap.error("--forks must be at least 1")
    # Python 3.12 warns at every fork of a process with threads; this probe forks on purpose.
    warnings.simplefilter("ignore", DeprecationWarning)
    stop = threading.Event()
    entries = [[0], [0]]  # one counter per spawning thread
    spawners = [threading.Thread(target=_start_native_threads, args=(stop, e)) for e in entries]
    for thread in spawners:
        thread.start()
    began, hung = time.monotonic(), 0
    while not any(e[0] for e in entries) and time.monotonic() - began < 10:
        time.sleep(0.01)  # the race begins once native threads enter Python
    try:
        for done in range(1, args.forks + 1):
            hung += _fork_one()
            if done % 5000 == 0:
                print(f"[probe] {done} forks, {hung} hung", file=sys.stderr, flush=True)
    finally:
        stop.set()
        for thread in spawners:
            thread.join()
    print(
        f"Python {sys.version.split()[0]}: {hung} of {args.forks} children hung; "
        f"{sum(e[0] for e in entries)} native threads entered Python meanwhile; "
        f"{time.monotonic() - began:.1f} s"
    )
    return 1 if hung else 0


if __name__ == "__main__":
    sys.exit(main())
