"""``pages.populate_for_write``: one call maps a load target's pages; contents never change."""

from __future__ import annotations

import ctypes
import errno
import itertools
import resource
import sys

import pytest
import torch

from trainer_runtime.resume import pages

MiB = 1 << 20


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux")
def test_a_populated_fresh_tensor_is_written_without_a_fault_per_page():
    size = 64 * MiB  # above glibc's largest mmap threshold: fresh pages from the kernel
    fresh = torch.empty(size, dtype=torch.uint8)
    assert pages.populate_for_write(fresh)
    before = minor_faults()
    fresh.fill_(1)
    populated = minor_faults() - before

    unpopulated = torch.empty(size, dtype=torch.uint8)
    before = minor_faults()
    unpopulated.fill_(1)
    faulted = minor_faults() - before
    assert faulted >= size // pages._PAGE // 2  # the baseline really faults page by page
    assert populated < faulted // 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore is asked of Linux")
def test_pages_are_present_only_once_every_whole_page_was_touched():
    buf = torch.empty(64 * MiB, dtype=torch.uint8)  # above glibc's largest mmap threshold
    assert not pages.all_present(buf)
    buf[: 32 * MiB].fill_(1)
    assert not pages.all_present(buf)  # half of it
    assert pages.all_present(buf[: 32 * MiB])
    buf[-1] = 1
    assert not pages.all_present(buf)  # the last page alone does not make it whole
    buf.fill_(1)
    assert pages.all_present(buf)
    assert not pages.all_present(torch.ones(8))  # no whole page inside


def test_populating_changes_no_byte_and_stays_inside_the_tensor():
    whole = torch.arange(3 * MiB, dtype=torch.int32)
    inner = whole[1001 : 2 * MiB + 7]  # starts and ends inside pages shared with neighbours
    expected = whole.clone()
    pages.populate_for_write(inner)
    assert torch.equal(whole, expected)


def test_whether_pages_can_be_populated_is_asked_of_the_kernel_once(monkeypatch):
    calls = []

    def kernel_without_the_call(address, length, advice):
        calls.append((length, advice))
        ctypes.set_errno(errno.EINVAL)
        return -1

    monkeypatch.setattr(pages, "_MADVISE", kernel_without_the_call)
    monkeypatch.setattr(pages, "_supported", True)
    monkeypatch.setattr(pages, "_probed", None)
    assert pages.can_populate() is False
    assert pages.can_populate() is False
    assert calls == [(pages._PAGE, pages._MADV_POPULATE_WRITE)]  # one probe, one page
    assert not pages.populate_for_write(torch.empty(4 * MiB, dtype=torch.uint8))
    assert len(calls) == 1  # remembered: the kernel is not asked again


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE is Linux")
def test_this_kernel_can_populate_pages(monkeypatch):
    monkeypatch.setattr(pages, "_probed", None)
    assert pages.can_populate() is True


def test_what_cannot_be_populated_is_left_alone():
    assert not pages.populate_for_write(torch.empty(10, dtype=torch.uint8))  # no whole page
    assert not pages.populate_for_write(torch.empty(MiB, device="meta"))


def test_page_spans_cover_exactly_the_whole_pages_inside_the_tensor():
    whole = torch.empty(3 * MiB + 5000, dtype=torch.uint8)
    inner = whole[1001:]  # starts inside a page shared with its neighbour
    spans = pages.page_spans(inner, MiB + 1)  # rounded down to whole pages
    page = pages._PAGE
    lo, hi = pages.whole_pages(inner)
    assert lo >= inner.data_ptr() and lo - inner.data_ptr() < page
    assert hi <= inner.data_ptr() + inner.numel() and inner.data_ptr() + inner.numel() - hi < page
    assert spans[0][0] == lo and sum(n for _, n in spans) == hi - lo
    for (a, n), (b, _) in itertools.pairwise(spans):
        assert a % page == 0 and n == MiB and a + n == b  # contiguous, in order, none larger
    assert pages.page_spans(torch.empty(MiB, device="meta"), MiB) == []
