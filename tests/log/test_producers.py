"""The idempotent producers' state of a partition log (broker.log.producers): a set sent again
is stored once, across reopening, rolls, truncation and a crash between entry and bytes."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.errors import (
    DuplicateSequence,
    InvalidProducerEpoch,
    OutOfOrderSequence,
    TooManyProducers,
    UnknownProducerId,
)
from broker.log.config import LogConfig
from broker.log.message import encode_message, iter_messages
from broker.log.partition import PartitionLog
from broker.log.producers import (
    ENTRY,
    MAX_PRODUCERS,
    PROTECTED_S,
    RESERVED,
    StoredSet,
    producers_path,
)
from tests.conftest import FakeClock

PRODUCER = 0x2F1E5D4C3B2A1908


def one(value: bytes) -> bytes:
    return encode_message(value, timestamp_ms=1_700_000_000_000)


def stored_values(plog: PartitionLog) -> list[bytes]:
    plog.flush()
    values = []
    offset = plog.log_start_offset
    while offset < plog.flushed_offset:
        chunk = plog.read(offset, 1 << 20)
        values += [bytes(m.value) for m in iter_messages(chunk)]
        offset += len(chunk)
    return values


def test_a_set_sent_again_is_stored_once_and_answered_with_its_first_offset(
    tmp_path: Path,
) -> None:
    with PartitionLog.open(tmp_path / "t-0") as plog:
        first, appended = plog.append_idempotent(one(b"a"), PRODUCER, 0, 0)
        assert appended
        again, appended = plog.append_idempotent(one(b"a"), PRODUCER, 0, 0)
        assert not appended and again == first
        second, appended = plog.append_idempotent(one(b"b"), PRODUCER, 0, 1)
        assert appended and second.offset == first.end
        older, appended = plog.append_idempotent(one(b"a"), PRODUCER, 0, 0)  # two back: on disk
        assert not appended and older == first
        assert stored_values(plog) == [b"a", b"b"]


def test_out_of_order_and_fenced_sets_are_refused_and_nothing_is_appended(
    tmp_path: Path,
) -> None:
    with PartitionLog.open(tmp_path / "t-0") as plog:
        for sequence in range(5):
            plog.append_idempotent(one(b"a%d" % sequence), PRODUCER, 1, sequence)
        end = plog.log_end_offset
        with pytest.raises(OutOfOrderSequence, match="sequence 5 is expected next") as gap:
            plog.append_idempotent(one(b"c"), PRODUCER, 1, 6)
        assert gap.value.expected == 5
        with pytest.raises(InvalidProducerEpoch, match="fenced") as fenced:
            plog.append_idempotent(one(b"c"), PRODUCER, 0, 5)
        assert fenced.value.current_epoch == 1
        assert plog.log_end_offset == end
        # a new epoch, and a producer not seen before (or forgotten), start at 0
        with pytest.raises(OutOfOrderSequence) as first:
            plog.append_idempotent(one(b"c"), PRODUCER, 2, 9)
        assert first.value.expected == 0
        with pytest.raises(UnknownProducerId, match="knows no set of producer"):
            plog.append_idempotent(one(b"c"), PRODUCER + 1, 0, 9)
        assert plog.append_idempotent(one(b"d"), PRODUCER, 2, 0)[1]
        assert plog.append_idempotent(one(b"e"), PRODUCER + 1, 0, 0)[1]
        # the sequence wraps after 2**32 - 1
        plog.producers.record([StoredSet(PRODUCER + 2, 0, 2**32 - 2, 0, 0, 0)])
        assert plog.append_idempotent(one(b"f"), PRODUCER + 2, 0, 2**32 - 1)[1]
        assert plog.append_idempotent(one(b"g"), PRODUCER + 2, 0, 0)[1]
        assert stored_values(plog) == [b"a0", b"a1", b"a2", b"a3", b"a4", b"d", b"e", b"f", b"g"]


def test_a_sequence_before_a_producers_first_set_was_never_stored(tmp_path: Path) -> None:
    """Counted modulo 2^32, 2^32 - 1 comes before 0; but a producer whose first set of the
    epoch (sequence 0) the partition still has sent nothing before it: such a set is out of
    order, not DUPLICATE_SEQUENCE ("stored already", which a client drops as stored)."""
    with PartitionLog.open(tmp_path / "t-0") as plog:
        plog.append_idempotent(one(b"a"), PRODUCER, 0, 0)
        plog.append_idempotent(one(b"b"), PRODUCER, 0, 1)
        end = plog.log_end_offset
        for sequence in (2**32 - 1, 2**31 + 5):
            with pytest.raises(OutOfOrderSequence, match="sequence 2 is expected next") as gap:
                plog.append_idempotent(one(b"c"), PRODUCER, 0, sequence)
            assert gap.value.expected == 2
        assert plog.log_end_offset == end
        assert stored_values(plog) == [b"a", b"b"]
        # a producer whose sequences wrapped (its entry of 2^32 - 2 on file) may have sent
        # 2^32 - 3, its segment gone since: stored already
        plog.producers.record([StoredSet(PRODUCER + 1, 0, 2**32 - 2, 0, 0, 0)])
        assert plog.append_idempotent(one(b"c"), PRODUCER + 1, 0, 2**32 - 1)[1]
        assert plog.append_idempotent(one(b"d"), PRODUCER + 1, 0, 0)[1]
        with pytest.raises(DuplicateSequence, match="stored already"):
            plog.append_idempotent(one(b"x"), PRODUCER + 1, 0, 2**32 - 3)


def test_the_state_survives_reopening_and_rolls_and_goes_with_deleted_segments(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=200)
    folder = tmp_path / "t-0"
    with PartitionLog.open(folder, config) as plog:
        firsts = [plog.append_idempotent(one(b"x" * 40), PRODUCER, 0, s)[0] for s in range(6)]
        plog.append_idempotent(one(b"other"), PRODUCER + 1, 0, 0)
        assert len(plog.segments) > 2
    with PartitionLog.open(folder, config) as plog:  # the last segment's file alone: snapshot
        assert plog.append_idempotent(one(b"x" * 40), PRODUCER, 0, 5) == (firsts[5], False)
        assert plog.append_idempotent(one(b"other"), PRODUCER + 1, 0, 0)[1] is False
        assert plog.append_idempotent(one(b"x" * 40), PRODUCER, 0, 1) == (firsts[1], False)
        plog.advance_start(plog.segments[-1].base_offset)  # the old segments go, entries too
        plog.local.apply_retention()
        with pytest.raises(DuplicateSequence, match="stored already"):
            plog.append_idempotent(one(b"x" * 40), PRODUCER, 0, 1)
        assert sorted(p.name for p in folder.glob("*.producers")) == [
            producers_path(folder, s.base_offset).name for s in plog.segments
        ]


def test_a_cut_log_forgets_the_sets_it_cut(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path / "t-0") as plog:
        first = plog.append_idempotent(one(b"a"), PRODUCER, 0, 0)[0]
        plog.append_idempotent(one(b"b"), PRODUCER, 0, 1)
        plog.flush()
        plog.truncate_to(first.end)
        assert plog.producers.last(PRODUCER) == first
        assert plog.append_idempotent(one(b"b"), PRODUCER, 0, 1)[1]  # stored again, once
        plog.reset_to(1000)
        assert plog.producers.last(PRODUCER) is None
        assert plog.append_idempotent(one(b"c"), PRODUCER, 0, 0)[1]
        assert stored_values(plog) == [b"c"]


def test_an_entry_whose_bytes_did_not_survive_is_dropped_and_a_torn_one_cut(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "t-0"
    with PartitionLog.open(folder) as plog:
        kept = plog.append_idempotent(one(b"a"), PRODUCER, 0, 0)[0]
        plog.append_idempotent(one(b"b"), PRODUCER, 0, 1)
        base = plog.segments[-1].base_offset
        log_path = plog.segments[-1].log_path
    entries = producers_path(folder, base)
    os.truncate(log_path, kept.end)  # a crash took the second set's bytes, not its entry
    with open(entries, "ab") as file:
        file.write(ENTRY.pack(PRODUCER + 5, 0, 0, 0, 1, 1)[:20])  # and tore a third entry
    with PartitionLog.open(folder) as plog:
        assert plog.producers.last(PRODUCER) == kept
        assert entries.stat().st_size == ENTRY.size
        assert plog.append_idempotent(one(b"b"), PRODUCER, 0, 1)[1]


@pytest.mark.xfail(
    strict=True,
    reason='open (docs/storage.md, "Producer state"): a set\'s bytes kept without its entry are '
    "a set the partition knows no producer of; the producer's id and sequence are not in the "
    "stored bytes, so the recovery cannot rebuild the entry",
)
def test_a_set_whose_bytes_outlived_its_entry_is_stored_once_when_sent_again(
    tmp_path: Path,
) -> None:
    """A power loss can keep the bytes of a set appended but not yet flushed (never
    acknowledged) and lose its entry, both written back by the kernel on its own; the producer,
    never answered, sends the set again (tests/log/test_power_loss.py saw it over three
    brokers). It should be answered as stored, not stored a second time."""
    folder = tmp_path / "t-0"
    with PartitionLog.open(folder) as plog:
        first = plog.append_idempotent(one(b"a"), PRODUCER, 0, 0)[0]
        plog.flush()
        plog.append_idempotent(one(b"b"), PRODUCER, 0, 1, flush=False)  # not flushed: cut
        entries = producers_path(folder, plog.segments[-1].base_offset)
    os.truncate(entries, ENTRY.size)  # the cut kept the second set's bytes, not its entry
    with PartitionLog.open(folder) as plog:
        assert plog.producers.last(PRODUCER) == first
        plog.append_idempotent(one(b"b"), PRODUCER, 0, 1)
        assert stored_values(plog) == [b"a", b"b"]


def test_the_producers_remembered_are_bounded_and_none_active_is_forgotten(
    tmp_path: Path, clock: FakeClock
) -> None:
    """MAX_PRODUCERS at most; a new one takes the least recently active one's place only once
    that one stored nothing for PROTECTED_S: until then it is refused, nothing forgotten."""
    with PartitionLog.open(tmp_path / "t-0", clock=clock) as plog:
        for producer in range(1, MAX_PRODUCERS + 1):
            plog.append_idempotent(one(b"v"), producer, 0, 0)
        clock.advance(PROTECTED_S - 1)
        plog.append_idempotent(one(b"w"), MAX_PRODUCERS, 0, 1)  # the last one stays active
        end = plog.log_end_offset
        with pytest.raises(TooManyProducers, match="4096 idempotent producers"):
            plog.append_idempotent(one(b"new"), MAX_PRODUCERS + 1, 0, 0)
        assert plog.log_end_offset == end and plog.producers.last(1) is not None
        clock.advance(1)  # producer 1 idle PROTECTED_S: its place may be taken
        assert plog.append_idempotent(one(b"new"), MAX_PRODUCERS + 1, 0, 0)[1]
        assert plog.producers.producers == MAX_PRODUCERS
        assert plog.producers.last(1) is None  # the least recent, forgotten
        with pytest.raises(UnknownProducerId):  # told so, not taken for a gap
            plog.append_idempotent(one(b"v2"), 1, 0, 1)


def test_one_client_id_cannot_take_the_places_kept_for_the_others(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Issue 50, 6: a client id that makes up producer ids took every place of a partition,
    and every other client's new producer was refused for PROTECTED_S. Once the partition
    remembers MAX_PRODUCERS - RESERVED, a client id holding RESERVED or more gets no new
    place but the place of its own least recently active producer, once that one is idle
    PROTECTED_S: the last RESERVED places are the others'."""

    def client(name: str) -> Callable[[], str]:
        return lambda: name

    with PartitionLog.open(tmp_path / "t-0", clock=clock) as plog:
        for producer in range(1, MAX_PRODUCERS - RESERVED + 1):
            plog.append_idempotent(one(b"a"), producer, 0, 0, client=client("churner"))
        end = plog.log_end_offset
        with pytest.raises(TooManyProducers, match="3072 of them of client id 'churner'"):
            plog.append_idempotent(one(b"a"), 9_000, 0, 0, client=client("churner"))
        assert plog.log_end_offset == end
        for producer in range(10_000, 10_000 + RESERVED):  # the last places: the others'
            plog.append_idempotent(one(b"b"), producer, 0, 0, client=client(f"c{producer % 7}"))
        assert plog.producers.producers == MAX_PRODUCERS
        clock.advance(PROTECTED_S)
        plog.append_idempotent(one(b"a"), 1, 0, 1, client=client("churner"))  # 1 is active
        # The churner's least recently active (2), idle PROTECTED_S, gives its place:
        assert plog.append_idempotent(one(b"a"), 9_000, 0, 0, client=client("churner"))[1]
        assert plog.producers.last(2) is None
        assert plog.producers.last(1) is not None and plog.producers.last(10_000) is not None
        # The table is full, its least recently active producer (3) idle: another client
        # id's new producer takes that place, as any new producer would.
        assert plog.append_idempotent(one(b"c"), 9_002, 0, 0, client=client("newcomer"))[1]
        assert plog.producers.last(3) is None and plog.producers.producers == MAX_PRODUCERS


def test_a_live_producers_set_sent_again_is_stored_once_whatever_others_produce(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Issue 50, 6: 5,000 new producer ids (another client's, one set each) made a live
    producer's set sent again (its reply lost) answer as a new producer's: stored twice. A
    producer active within PROTECTED_S is never forgotten for others: the newcomers past
    MAX_PRODUCERS are refused, and the set sent again is answered with its first offset."""
    with PartitionLog.open(tmp_path / "t-0", clock=clock) as plog:
        kept, _ = plog.append_idempotent(one(b"live"), PRODUCER, 0, 0)
        refused = 0
        for producer in range(1, 5_001):
            try:
                plog.append_idempotent(one(b"x"), producer, 0, 0)
            except TooManyProducers:
                refused += 1
        assert refused == 5_000 - (MAX_PRODUCERS - 1)
        again, appended = plog.append_idempotent(one(b"live"), PRODUCER, 0, 0)
        assert not appended and again == kept
        assert stored_values(plog).count(b"live") == 1
