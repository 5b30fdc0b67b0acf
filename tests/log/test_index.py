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
    loaded, damaged = OffsetIndex.load(path, 10_000)
    assert loaded is not None and loaded.entries() == [0, 4096, 9000] and damaged is None


def test_index_for_another_segment_size_or_missing_is_stale_not_damaged(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    OffsetIndex([0, 4096]).write(path, 10_000)
    assert OffsetIndex.load(path, 10_001) == (None, None)
    assert OffsetIndex.load(tmp_path / "missing.index", 0) == (None, None)


def test_a_flipped_bit_anywhere_in_an_index_after_its_size_is_damage(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    OffsetIndex([0, 4096, 9000]).write(path, 10_000)
    stored = path.read_bytes()
    for position in range(8, len(stored)):
        flipped = bytearray(stored)
        flipped[position] ^= 0x10
        path.write_bytes(bytes(flipped))
        assert OffsetIndex.load(path, 10_000) == (None, "it fails its checksum"), position
    path.write_bytes(stored[:-2])
    assert OffsetIndex.load(path, 10_000) == (None, "its length 26 does not fit its layout")


def test_index_with_entries_not_from_0_or_past_the_segment_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    for entries in ([0, 10_000], [5], []):
        OffsetIndex(entries).write(path, 10_000)
        index, damaged = OffsetIndex.load(path, 10_000)
        assert index is None and damaged is not None, entries
    path.write_bytes(b"\x00" * 9)
    assert OffsetIndex.load(path, 0) == (None, "its length 9 does not fit its layout")
