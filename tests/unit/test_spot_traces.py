"""The trace model (pure): parsing each public format, and what a window, a compression, a cap,
a change and a node-second mean, on small traces whose answers are known by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import spot_traces as st
from benchmarks.spot_traces import Trace


def trace(*points: tuple[float, int]) -> Trace:
    return Trace("hand", "here", tuple(points))


# (0,4) ... 100 -> 2 ... 150 -> 4 ... 300 end
DIP = trace((0, 4), (100, 2), (150, 4), (300, 4))


# -- the model ----------------------------------------------------------------------------------


def test_available_is_the_value_after_the_last_change_at_or_before_t():
    assert [DIP.available(t) for t in (0, 99.9, 100, 149, 150, 300, 1e9)] == [4, 4, 2, 2, 4, 4, 4]
    with pytest.raises(ValueError, match="before the trace's start"):
        DIP.available(-1)


def test_changes_list_each_change_before_the_end_and_not_the_end_itself():
    assert DIP.changes() == [(100, 4, 2), (150, 2, 4)]
    # A last point with another value only ends the trace: no change at the end.
    assert trace((0, 3), (50, 1), (60, 2)).changes() == [(50, 3, 1)]
    # Repeated values are not changes.
    assert trace((0, 3), (10, 3), (20, 3)).changes() == []


def test_node_seconds_integrates_the_step_function_and_caps_each_value():
    assert DIP.node_seconds() == 100 * 4 + 50 * 2 + 150 * 4
    assert DIP.node_seconds(cap=3) == 100 * 3 + 50 * 2 + 150 * 3
    assert trace((0, 7)).node_seconds() == 0


def test_window_is_re_based_starts_with_the_value_then_and_is_clipped_at_the_end():
    w = DIP.window(120, 100)
    assert w.points == ((0, 2), (30, 4), (100, 4))
    assert w.changes() == [(30, 2, 4)]
    assert w.node_seconds() == 30 * 2 + 70 * 4
    clipped = DIP.window(250, 500)
    assert clipped.duration == 50
    assert clipped.node_seconds() == 50 * 4
    # Starting exactly at a change: the window opens with the value after it.
    assert DIP.window(100, 10).points == ((0, 2), (10, 2))
    with pytest.raises(ValueError, match="outside the trace"):
        DIP.window(301, 10)


def test_compressed_divides_time_and_keeps_node_seconds_over_the_factor():
    c = DIP.compressed(60)
    assert c.points == ((0, 4), (100 / 60, 2), (150 / 60, 4), (5, 4))
    assert c.node_seconds() == pytest.approx(DIP.node_seconds() / 60)
    with pytest.raises(ValueError, match="above 0"):
        DIP.compressed(0)


def test_capped_takes_the_minimum_and_drops_changes_above_the_cap():
    t = trace((0, 8), (10, 5), (20, 2), (30, 6), (40, 6))
    assert t.capped(5).points == ((0, 5), (20, 2), (30, 5), (40, 5))
    assert t.capped(5).changes() == [(20, 5, 2), (30, 2, 5)]
    assert t.capped(1).changes() == []


def test_points_are_validated():
    with pytest.raises(ValueError, match="not 0"):
        trace((5, 1), (10, 1))
    with pytest.raises(ValueError, match="backwards"):
        trace((0, 1), (10, 2), (5, 1))
    with pytest.raises(ValueError, match="-1 nodes"):
        trace((0, 1), (10, -1))
    with pytest.raises(ValueError, match="no points"):
        trace()


def test_rotated_wraps_around_and_keeps_the_integral():
    r = DIP.rotated(120)
    # The part from 120 s, then the first 120 s (its dip now at 280 s).
    assert r.points == ((0, 2), (30, 4), (280, 2), (300, 2))
    assert r.node_seconds() == DIP.node_seconds()


def test_scaled_caps_within_the_pool_and_tiles_independent_pools_beyond_it():
    assert st.scaled(DIP, 3).points == DIP.capped(3).points
    # Two pools of DIP, the second rotated by half the trace (150 s): its dip at 100 s moves to
    # 250 s, so the 8-node gang loses 2 nodes twice, at different times.
    two = st.scaled(DIP, 8)
    assert two.changes() == [(100, 8, 6), (150, 6, 8), (250, 8, 6)]
    assert two.node_seconds() == pytest.approx(2 * DIP.node_seconds())
    # Three pools capped at 10: a single dip of 2 never takes the gang below 10.
    assert st.scaled(DIP, 10).changes() == []


def test_proportional_scales_the_counts_of_one_pool():
    p = st.proportional(DIP, 16)
    assert p.changes() == [(100, 16, 8), (150, 8, 16)]


def test_busiest_window_starts_a_tenth_before_the_densest_run_of_changes():
    t = trace((0, 4), (100, 3), (1000, 4), (1010, 3), (1020, 4), (1030, 2), (5000, 2))
    assert st.busiest_window(t, 100, 4) == pytest.approx(990)
    # Changes above the gang's size do not count: a 2-node gang sees none of them.
    assert st.busiest_window(t, 100, 2) == 0.0
    assert st.busiest_window(t, 10_000, 4) == 0.0


def test_stats_count_changes_and_node_losses_per_node_hour():
    # 2 hours of 4 nodes with one loss of 2 nodes for half an hour.
    t = trace((0, 4), (3600, 2), (5400, 4), (7200, 4))
    s = st.stats(t)
    assert s.nodes == 4
    assert s.hours == 2
    assert s.changes_per_hour == 1.0
    node_hours = 1 * 4 + 0.5 * 2 + 0.5 * 4
    assert s.losses_per_node_hour == pytest.approx(2 / node_hours)
    assert s.mean_available == pytest.approx(node_hours / 2 / 4)
    assert s.full_share == 0.75
    assert s.zero_share == 0
    assert st.stats(t, 2).changes_per_hour == 0


# -- parsing ------------------------------------------------------------------------------------


def test_skypilot_json_is_one_sample_per_gap_and_ends_one_gap_after_the_last():
    text = json.dumps({"metadata": {"gap_seconds": 300}, "data": [0, 4, 4, 1, 4]})
    t = st.parse_skypilot(text, "x.json", "sky", "src")
    assert t.points == ((0, 0), (300, 4), (900, 1), (1200, 4), (1500, 4))
    assert t.duration == 1500
    assert t.source == "src"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"metadata": {"gap_seconds": 300},\n "data": [1, 2,]}', r"x\.json:2: not JSON"),
        ('{"metadata": {},\n "data": [1]}', r"x\.json:1: metadata\.gap_seconds is None"),
        ('{"metadata": {"gap_seconds": 300},\n "data": [1, -2]}', r"x\.json:2: data\[1\] is -2"),
        ('{"metadata": {"gap_seconds": 300},\n "data": [1, 2.5]}', r"x\.json:2: data\[1\] is 2.5"),
        ('{"metadata": {"gap_seconds": 300}, "data": []}', r"x\.json:1: \"data\" is empty"),
        ("[1, 2]", r'x\.json:1: no "data" list'),
    ],
)
def test_skypilot_errors_name_the_file_and_line(text: str, message: str):
    with pytest.raises(st.TraceError, match=message):
        st.parse_skypilot(text, "x.json", "sky", "src")


def test_bamboo_csv_takes_the_second_of_two_rows_at_a_time_and_ends_at_the_last_row():
    text = "0,0\r\n100,0\r\n100,4\r\n250,4\r\n250,3\r\n400,3\r\n400,2\r\n"
    t = st.parse_bamboo(text, "b.csv", "bam", "src")
    assert t.points == ((0, 0), (100, 4), (250, 3), (400, 2))
    assert t.changes() == [(100, 0, 4), (250, 4, 3)]
    assert t.duration == 400


def test_bamboo_csv_in_hours_and_with_a_header():
    t = st.parse_bamboo("seconds,instances\n0.5,2\n1.0,2\n", "b.csv", "bam", "src", 3600)
    # The first row is not at 0: its value holds from the start.
    assert t.points == ((0, 2), (3600, 2))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,1\n5,x\n", r"b\.csv:2: '5,x' is not 'seconds,instances'"),
        ("0,1\n5,1,2\n", r"b\.csv:2: .*3 fields"),
        ("0,1\n10,1\n5,2\n", r"b\.csv:3: time 5 is before the row above it"),
        ("0,1\n10,-1\n", r"b\.csv:2: .*must not be negative"),
        ("\n\n", r"b\.csv:1: no rows"),
    ],
)
def test_bamboo_errors_name_the_file_and_line(text: str, message: str):
    with pytest.raises(st.TraceError, match=message):
        st.parse_bamboo(text, "b.csv", "bam", "src")


# -- the known traces ---------------------------------------------------------------------------


def test_git_blob_id_is_what_git_hash_object_gives():
    assert st.git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"
    assert st.git_blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"


@pytest.mark.parametrize("name", [n for n in st.known_traces() if n.startswith("bamboo/")])
def test_shipped_bamboo_traces_load_and_match_their_citation(name: str):
    t = st.load(name)
    assert name in st.available_traces()
    assert t.source.startswith(f"{st.BAMBOO_REPO}@{st.BAMBOO_COMMIT[:12]}:doc/data/")
    assert t.duration > 10 * 3600
    assert t.changes()
    assert t.peak in (12, 16)


def test_a_missing_skypilot_trace_says_how_to_get_it(tmp_path: Path, monkeypatch):
    monkeypatch.delenv(st.SKYPILOT_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    name = "skypilot/preemption-4node-us-east-1f-v100"
    assert name in st.known_traces()
    assert name not in st.available_traces()
    with pytest.raises(st.TraceMissingError, match=r"spot_traces\.py fetch"):
        st.load(name)


def test_a_skypilot_checkout_is_read_and_checked_against_the_cited_blob(
    tmp_path: Path, monkeypatch
):
    name = "skypilot/availability-16node-us-east-2b-v100"
    content = b'{"metadata": {"gap_seconds": 300}, "data": [16, 16, 3, 16]}'
    path = tmp_path / st.KNOWN[name].path
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    monkeypatch.setenv(st.SKYPILOT_ENV, str(tmp_path))
    with pytest.raises(st.TraceError, match="not the file cited"):
        st.load(name)
    cited = st.KNOWN[name]
    monkeypatch.setitem(
        st.KNOWN, name, st.Known(cited.repo, cited.commit, cited.path, st.git_blob_id(content))
    )
    t = st.load(name)
    assert t.changes() == [(600, 16, 3), (900, 3, 16)]
    assert name in st.available_traces()


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="bamboo/g4dn"):
        st.load("nope")
