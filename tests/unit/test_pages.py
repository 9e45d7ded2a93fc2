"""``pages.populate_for_write``: one call maps a load target's pages; contents never change."""

from __future__ import annotations

import resource
import sys

import pytest
import torch

from trainer_runtime import pages

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


def test_populating_changes_no_byte_and_stays_inside_the_tensor():
    whole = torch.arange(3 * MiB, dtype=torch.int32)
    inner = whole[1001 : 2 * MiB + 7]  # starts and ends inside pages shared with neighbours
    expected = whole.clone()
    pages.populate_for_write(inner)
    assert torch.equal(whole, expected)


def test_what_cannot_be_populated_is_left_alone():
    assert not pages.populate_for_write(torch.empty(10, dtype=torch.uint8))  # no whole page
    assert not pages.populate_for_write(torch.empty(MiB, device="meta"))
