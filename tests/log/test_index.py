"""The sparse index: lookups, and the file that marks a cleanly closed segment."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from broker.log.index import OffsetIndex

positions = st.lists(st.integers(min_value=1, max_value=10**6), unique=True).map(
    lambda xs: [0, *sorted(xs)]
)


@given(positions, st.integers(min_value=0, max_value=2 * 10**6))
def test_floor_by_bisect_equals_a_linear_scan(entries: list[int], position: int) -> None:
    expected = max(e for e in entries if e <= position)
    assert OffsetIndex(entries).floor(position) == expected


def test_truncate_drops_entries_at_or_after_the_cut() -> None:
    index = OffsetIndex([0, 100, 200, 300])
    index.truncate_to(200)
    assert index.entries() == [0, 100]


def test_written_index_loads_back_for_the_same_segment_size(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    OffsetIndex([0, 4096, 9000]).write(path, 10_000)
    loaded = OffsetIndex.load(path, 10_000)
    assert loaded is not None and loaded.entries() == [0, 4096, 9000]


def test_index_for_another_segment_size_is_stale(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    OffsetIndex([0, 4096]).write(path, 10_000)
    assert OffsetIndex.load(path, 10_001) is None
    assert OffsetIndex.load(tmp_path / "missing.index", 0) is None


def test_index_with_entries_out_of_order_or_past_the_segment_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    for entries in ([0, 500, 400], [0, 10_000], [5], []):
        OffsetIndex(entries).write(path, 10_000)
        assert OffsetIndex.load(path, 10_000) is None, entries
    path.write_bytes(b"\x00" * 9)
    assert OffsetIndex.load(path, 0) is None
