"""Which errors a benchmark treats as Ctrl-C (one line, exit 130) and which it lets through as
a crash: the interrupt itself, errors raised while handling it, and DCP's wrapped failures."""

from __future__ import annotations

import importlib
import signal
import traceback
from collections.abc import Iterator
from types import ModuleType

import pytest
from torch.distributed.checkpoint.api import CheckpointException


@pytest.fixture
def interrupt() -> Iterator[ModuleType]:
    """``benchmarks/interrupt.py``, imported the way a benchmark does (it sets a SIGINT
    handler on import); pytest's own handler is put back afterwards."""
    before = signal.getsignal(signal.SIGINT)
    try:
        yield importlib.import_module("benchmarks.interrupt")
    finally:
        signal.signal(signal.SIGINT, before)


def dcp_failure(exc: BaseException, rank: int = 0) -> CheckpointException:
    """A failed DCP save as ``dcp.save`` raises it: each rank's error with its stack."""
    return CheckpointException("write", {rank: (exc, traceback.extract_stack())})


def raised_while_handling(first: BaseException, second: BaseException) -> BaseException:
    try:
        try:
            raise first
        except BaseException:
            raise second  # noqa: B904 - the implicit context is what is tested
    except BaseException as exc:
        return exc
    raise AssertionError("unreachable")


def test_the_interrupt_itself_is_ctrl_c(interrupt: ModuleType) -> None:
    assert interrupt.caused_by_ctrl_c(KeyboardInterrupt())


def test_an_error_raised_while_handling_ctrl_c_is_ctrl_c(interrupt: ModuleType) -> None:
    exc = raised_while_handling(KeyboardInterrupt(), RuntimeError("unexpected pos"))
    assert interrupt.caused_by_ctrl_c(exc)


def test_a_dcp_save_broken_by_ctrl_c_on_one_rank_is_ctrl_c(interrupt: ModuleType) -> None:
    failed = CheckpointException(
        "write",
        {
            0: (OSError("disk"), traceback.extract_stack()),
            3: (KeyboardInterrupt(), traceback.extract_stack()),
        },
    )
    assert interrupt.caused_by_ctrl_c(failed)
    assert interrupt.caused_by_ctrl_c(raised_while_handling(failed, ValueError("clean-up")))


def test_real_failures_are_not_ctrl_c(interrupt: ModuleType) -> None:
    assert not interrupt.caused_by_ctrl_c(RuntimeError("boom"))
    assert not interrupt.caused_by_ctrl_c(dcp_failure(OSError("No space left on device")))
    chained = RuntimeError("save failed")
    chained.__cause__ = dcp_failure(ValueError("bad shape"))
    assert not interrupt.caused_by_ctrl_c(chained)


def test_a_cycle_of_contexts_ends(interrupt: ModuleType) -> None:
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert not interrupt.caused_by_ctrl_c(a)
