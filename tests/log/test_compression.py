"""Compressed sets (broker.log.compression, docs/storage.md): round trips through every codec,
the checks a producer's set passes on PRODUCE, damage found and reported whole, and what the
partition log does with sets: counts, reads for readers that cannot read them, recovery."""

from __future__ import annotations

import dataclasses
import struct
import tracemalloc
import zlib
from pathlib import Path

import lz4.frame
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xxhash import xxh3_64_intdigest

from broker.config import topic_settings
from broker.errors import InvalidMessage, InvalidTopic, MessageTooLarge, UnsupportedFormat
from broker.log import codec, compression, message
from broker.log.compression import Codec, Compressor
from broker.log.config import LogConfig
from tests.conftest import FakeClock
from tests.log.test_partition import make_set, open_log
from tests.log.test_recovery import flip

CODECS = [Codec.GZIP, Codec.LZ4, Codec.ZSTD]
inner_messages = st.lists(
    st.tuples(st.binary(max_size=200), st.none() | st.binary(max_size=12), st.integers(0, 2**40)),
    min_size=1,
    max_size=30,
)


def as_inner(message_set: bytes) -> bytes:
    """`message_set` with every checksum field 0: an inner set."""
    data = bytearray(message_set)
    pos = 0
    while pos < len(data):
        data[pos + 4 : pos + 12] = bytes(8)
        pos += message.message_size_at(data, pos)
    return bytes(data)


def wrapped(compressor: Compressor, message_set: bytes) -> bytes:
    """The compressed set of the messages of `message_set`, as a producer makes it."""
    inner = as_inner(message_set)
    return compressor.wrap(inner, codec.set_timestamp(inner))


def encoded(batch: list[tuple[bytes, bytes | None, int]]) -> bytes:
    return b"".join(message.encode_message(value, key, ts) for value, key, ts in batch)


def rewrapped(wrapper: bytes, payload: bytes, attributes: int | None = None) -> bytes:
    """`wrapper` with `payload` for its value (and `attributes`), its framing and checksum made
    good again: what a producer that compressed wrongly would send."""
    head = bytearray(wrapper[: message.HEADER_SIZE])
    struct.pack_into(">I", head, 0, message.HEADER_SIZE - 4 + len(payload))
    if attributes is not None:
        head[message.ATTRIBUTES_AT] = attributes
    body = bytes(head[12:]) + payload
    struct.pack_into(">Q", head, 4, xxh3_64_intdigest(body))
    return bytes(head[:12]) + body


@given(inner_messages, st.sampled_from(CODECS), st.data())
@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
def test_every_codec_round_trips(
    batch: list[tuple[bytes, bytes | None, int]], codec_: Codec, data: st.DataObject
) -> None:
    level = data.draw(st.none() | st.sampled_from(list(compression.LEVELS[codec_])))
    plain = encoded(batch)
    wrapper = wrapped(Compressor(codec_, level), plain)
    assert message.timestamp_at(wrapper, 0) == max(ts for _, _, ts in batch)
    before = encoded([(b"first", None, 1)])
    buf = before + wrapper + before
    result = codec.scan(buf, 1 << 20)
    assert (result.error, result.message_count, result.first_new) == (None, 3, len(before))
    assert codec.check_sets(buf, result) == len(batch) + 2
    decoded, failure = codec.decode(buf, 1000)
    assert failure is None
    set_offset = 1000 + len(before)
    inner = message.iter_messages(as_inner(plain), 0, inner=True)
    expected = [m._replace(offset=set_offset, size=0) for m in inner]
    expected[-1] = expected[-1]._replace(size=len(wrapper))
    assert decoded[1:-1] == expected
    assert decoded[-1].offset == set_offset + len(wrapper) == decoded[-2].next_offset
    [(columns, failure)] = codec.decode_columns(buf, 1000, 1 << 60)
    assert (columns.rows, failure) == (len(batch) + 2, None)
    assert struct.unpack(f"={columns.rows}q", columns.offsets) == tuple(m.offset for m in decoded)
    # A read that ends at the set leaves it out whole; one that ends inside it takes it whole.
    [(columns, _)] = codec.decode_columns(buf, 1000, set_offset)
    assert columns.rows == 1
    [(columns, _)] = codec.decode_columns(buf, 1000, set_offset + 1)
    assert columns.rows == len(batch) + 1


@given(inner_messages, st.sampled_from(CODECS), st.data())
@settings(deadline=None, max_examples=100, suppress_health_check=[HealthCheck.too_slow])
def test_a_damaged_set_is_found_and_never_half_delivered(
    batch: list[tuple[bytes, bytes | None, int]], codec_: Codec, data: st.DataObject
) -> None:
    """Bits flipped in a set's compressed bytes, its checksum made good (damage before the
    checksum was computed: a broken producer): PRODUCE refuses it, and a reader gets either
    the set's messages exactly or none of them, and the failure at the set."""
    plain = encoded(batch)
    wrapper = wrapped(Compressor(codec_), plain)
    payload = bytearray(wrapper[message.HEADER_SIZE :])
    for _ in range(data.draw(st.integers(1, 3))):
        bit = data.draw(st.integers(0, len(payload) * 8 - 1))
        payload[bit // 8] ^= 1 << (bit % 8)
    before = encoded([(b"first", None, 1)])
    buf = before + rewrapped(wrapper, bytes(payload))
    decoded, failure = codec.decode(buf, 0)
    intact = [m.value for m in message.iter_messages(plain)]
    if failure is None:
        assert [m.value for m in decoded[1:]] == intact
        return
    assert failure.position == len(before)
    assert [m.value for m in decoded] == [b"first"]
    [(columns, column_failure)] = codec.decode_columns(buf, 0, 1 << 60)
    assert columns.rows == 1
    assert column_failure is not None and column_failure.position == len(before)
    with pytest.raises(InvalidMessage) as refused:
        codec.check_sets(buf, codec.scan(buf, 1 << 20))
    assert refused.value.position == len(before)


def test_the_column_reader_expands_within_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_columns (the Spark source's) stops expanding at a set's start once its chunk
    holds READ_MESSAGES rows or has expanded READ_EXPANDED_BYTES, and the next chunk goes on
    from there: each row once, in order, as one chunk without a budget gives them (a 1 MiB
    fetch may hold hundreds of sets, each 64 MiB expanded)."""
    plain = encoded([(b"plain", None, 1)])
    sets = [
        wrapped(Compressor(Codec.ZSTD), encoded([(b"s%dm%d" % (s, i), None, 1) for i in range(4)]))
        for s in range(5)
    ]
    buf = plain + b"".join(sets) + plain
    [(whole, failure)] = codec.decode_columns(buf, 1000, 1 << 60)
    assert (whole.rows, failure) == (22, None)
    for budget, value, rows in (
        ("READ_MESSAGES", 5, [5, 8, 9]),
        ("READ_EXPANDED_BYTES", 1, [5, 4, 4, 4, 5]),
    ):
        with monkeypatch.context() as patched:
            patched.setattr(codec, budget, value)
            chunks = list(codec.decode_columns(buf, 1000, 1 << 60))
        assert [(c.rows, f) for c, f in chunks] == [(n, None) for n in rows]
        assert b"".join(c.offsets for c, _ in chunks) == whole.offsets
        assert b"".join(c.value_data for c, _ in chunks) == whole.value_data
    # a read that ends inside the third set takes it whole, and no more
    end = 1000 + len(plain) + len(sets[0]) + len(sets[1]) + 1
    monkeypatch.setattr(codec, "READ_MESSAGES", 5)
    assert [c.rows for c, _ in codec.decode_columns(buf, 1000, end)] == [5, 8]
    # a damaged set after a chunk's end: the chunks before it, then the failure at it
    third = len(plain) + len(sets[0]) + len(sets[1])
    damaged = bytearray(buf)
    damaged[third + 40] ^= 0xFF
    chunks = list(codec.decode_columns(bytes(damaged), 1000, 1 << 60))
    assert [c.rows for c, _ in chunks] == [5, 4]
    failure = chunks[1][1]
    assert chunks[0][1] is None and failure is not None and failure.position == third


def refusal(buf: bytes) -> str:
    """Why PRODUCE refuses `buf`: the scan's error, else check_sets's."""
    result = codec.scan(buf, 1 << 20)
    if result.error is not None:
        return result.error
    with pytest.raises(InvalidMessage) as refused:
        codec.check_sets(buf, result)
    return refused.value.reason


def test_sets_producers_must_not_send_are_refused_with_the_reason() -> None:
    plain = encoded([(b"a", None, 1), (b"b", None, 2)])
    inner = as_inner(plain)
    zstd = wrapped(Compressor(Codec.ZSTD), plain)
    nested = wrapped(Compressor(Codec.GZIP), plain + zstd)
    assert "message at byte 54 of the set: a compressed set inside" in refusal(nested)
    checked = zstandard.ZstdCompressor(write_checksum=True)
    assert "the inner set is empty" in refusal(rewrapped(zstd, checked.compress(b"")))
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(inner)
    assert "does not give its content size" in refusal(rewrapped(zstd, no_size))
    no_checksum = zstandard.compress(inner)
    assert "the zstd frame has no content checksum" in refusal(rewrapped(zstd, no_checksum))
    extra = checked.compress(inner) + b"junk"
    assert "unused data" in refusal(rewrapped(zstd, extra))
    assert "message at byte 0 of the set: checksum field 0x" in refusal(
        rewrapped(zstd, checked.compress(plain))
    )  # messages with their own checksums: not an inner set
    no_size = lz4.frame.compress(inner, store_size=False, content_checksum=True)
    assert "lz4 frame does not give its content size" in refusal(rewrapped(zstd, no_size, 3))
    no_sum = lz4.frame.compress(inner)
    assert "the lz4 frame has no content checksum" in refusal(rewrapped(zstd, no_sum, 3))
    lz4_extra = lz4.frame.compress(inner, content_checksum=True) + b"junk"
    assert "4 bytes follow the lz4 data" in refusal(rewrapped(zstd, lz4_extra, Codec.LZ4))
    gzip_cut = zlib.compress(inner, wbits=31)[:-5]
    assert "cut short or damaged" in refusal(rewrapped(zstd, gzip_cut, Codec.GZIP))
    assert "unsupported compression codec 2 (snappy" in refusal(rewrapped(zstd, b"x", 2))
    assert "unsupported compression codec 5" in refusal(rewrapped(zstd, b"x", 5))
    assert "reserved attribute bits set: 0x14" in refusal(rewrapped(zstd, b"x", 0x14))
    not_plain = rewrapped(zstd, checked.compress(b"not a message set"))
    assert "message at byte 0 of the set: cut short" in refusal(not_plain)
    # a wrapper has no key (docs/protocol.md): one with a key is refused as that, whatever
    # its value holds (issue 50, 8: it was stored, and readers decompressed from the key on)
    payload = zstd[message.HEADER_SIZE :]
    for key in (b"k", b"\x28\xb5\x2f\xfd"):  # the second: zstd's magic number
        keyed = bytearray(rewrapped(zstd, key + payload))
        struct.pack_into(">i", keyed, message.HEADER_SIZE - 4, len(key))
        body = bytes(keyed[12:])
        struct.pack_into(">Q", keyed, 4, xxh3_64_intdigest(body))
        reason = refusal(bytes(keyed))
        assert f"its wrapper has a key ({len(key)} bytes): a compressed set's has none" in reason


def test_an_inner_set_over_the_bound_is_refused_before_it_is_decompressed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain = encoded([(b"v" * 500, None, 1)] * 4)
    monkeypatch.setattr(compression, "MAX_INNER_SET_BYTES", len(plain) - 1)
    for codec_ in CODECS:
        assert "over the bound" in refusal(wrapped(Compressor(codec_), plain)) or "more than" in (
            refusal(wrapped(Compressor(codec_), plain))
        )
    monkeypatch.setattr(compression, "MAX_INNER_SET_BYTES", len(plain))
    for codec_ in CODECS:
        assert codec.check_sets(*_scanned(wrapped(Compressor(codec_), plain))) == 4


def test_a_producers_sets_expand_within_one_budget_each_checked_before_it_is_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The compressed sets of one producer's message set are decompressed within
    MAX_EXPANDED_BYTES in all (issue 50, 1: 16 sets of 64 MiB each took a worker to 2 GiB):
    past it MessageTooLarge, each set's inner set decompressed within what is left (a frame
    that says its size, lz4's and zstd's, not at all when it does not fit)."""
    plain = encoded([(b"\0" * 3000, None, 1)])
    sizes: list[int] = []
    expand = compression.expand

    def counted(codec_: int, compressed: bytes, bound: int | None = None) -> bytes:
        sizes.append(bound or 0)
        return expand(codec_, compressed, bound)

    monkeypatch.setattr(compression, "expand", counted)
    monkeypatch.setattr(compression, "MAX_EXPANDED_BYTES", 2 * len(plain))
    for last in CODECS:
        sets = [wrapped(Compressor(c), plain) for c in (Codec.GZIP, Codec.ZSTD, last)]
        assert codec.check_sets(*_scanned(b"".join(sets[:2]))) == 2  # the budget, exactly
        sizes.clear()
        with pytest.raises(MessageTooLarge, match=f"limit of {2 * len(plain)} bytes"):
            codec.check_sets(*_scanned(b"".join(sets)))
        assert sizes == [2 * len(plain), len(plain), 0]  # what was left, each time


def test_a_bomb_of_sets_is_refused_before_it_is_converted(tmp_path: Path, clock: FakeClock) -> None:
    """Real sizes: three gzip sets of 30 MiB of zeros each (30 KB on the wire each) to a topic
    that stores its sets plain are refused past the 64 MiB budget, having held one inner set
    at a time, and nothing is appended."""
    plain = encoded([(bytes(30 << 20), None, 1)])
    bomb = wrapped(Compressor(Codec.GZIP), plain)
    del plain
    log = open_log(tmp_path / "t-0", clock, compression="none", max_message_bytes=40 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(MessageTooLarge, match="decompressed"):
            log.append(bomb * 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # one 30 MiB inner set at a time, its decompression's buffers included (180 MiB before,
    # the 90 MiB of plain messages appended)
    assert peak < 100 << 20, f"peak {peak >> 20} MiB"
    assert log.log_end_offset == 0


@pytest.mark.parametrize("compression", ["producer", "none"])
def test_a_message_inside_a_set_is_held_to_max_message_bytes(
    tmp_path: Path, clock: FakeClock, compression: str
) -> None:
    """A message inside a compressed set is a message: over the topic's max_message_bytes it
    refuses the set, MESSAGE_TOO_LARGE naming it, nothing appended (a zstd set of a 2 MiB
    message, 200 bytes sent, was stored by a topic of 1 MiB messages; converted to plain, as
    a 2 MiB message: past what its consumers and followers fetch at a time)."""
    inner = encoded([(b"small", None, 1), (bytes(2 << 20), None, 1)])
    log = open_log(tmp_path / "t-0", clock, compression=compression, max_message_bytes=1 << 20)
    with pytest.raises(
        MessageTooLarge,
        match=r"^message at byte 31 of the compressed set at byte 0 of 2097178 bytes is over "
        r"the limit of 1048576 bytes$",
    ):
        log.append(wrapped(Compressor(Codec.ZSTD), inner))
    assert log.log_end_offset == 0
    log.append(wrapped(Compressor(Codec.ZSTD), encoded([(bytes(1000), None, 1)])))  # one fits


def test_a_set_of_more_than_max_set_messages_is_refused_and_none_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 50, 5: a producer's compressed set holds at most MAX_SET_MESSAGES messages (here
    4); the broker's conversion to a topic's codec makes sets of no more."""
    monkeypatch.setattr(compression, "MAX_SET_MESSAGES", 4)
    four = encoded([(b"m%d" % i, None, i) for i in range(4)])
    five = four + encoded([(b"m4", None, 4)])
    assert codec.check_sets(*_scanned(wrapped(Compressor(Codec.ZSTD), four))) == 4
    assert "compressed set: 5 messages, over the 4 a set may hold" in refusal(
        wrapped(Compressor(Codec.ZSTD), five)
    )
    plain = four + five  # 9 plain messages, and a set of 4 of them, to a gzip topic
    mixed = plain + wrapped(Compressor(Codec.LZ4), four)
    stored = codec.converted(mixed, codec.scan(mixed, 1 << 20), Compressor(Codec.GZIP))
    assert stored is not None
    decoded, failure = codec.decode(stored, 0)
    values = [m.value for m in message.iter_messages(plain)] + [b"m0", b"m1", b"m2", b"m3"]
    assert failure is None and [m.value for m in decoded] == values
    offsets = [m.offset for m in decoded]
    counts = [offsets.count(offset) for offset in sorted(set(offsets))]
    assert counts == [4, 4, 1, 4]  # in order, 4 at most; the lz4 set's 4 a unit of their own


def test_a_reader_expands_a_fetch_within_its_budget_at_real_sizes() -> None:
    """Eight sets of 100,000 empty messages (MAX_SET_MESSAGES) in one fetched buffer, 2.6 MB
    each expanded, a few KB each on the wire: a reader's decode stops after the first, whose
    end is where the next fetch starts, its memory that of one set (all eight before)."""
    inner = b"".join([codec.encode_message(b"", None, 1, True)] * compression.MAX_SET_MESSAGES)
    one = Compressor(Codec.ZSTD).wrap(inner, 1)
    fetched = one * 8
    tracemalloc.start()
    try:
        decoded, failure = codec.decode(fetched, 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert failure is None and len(decoded) == compression.MAX_SET_MESSAGES
    assert decoded[-1].next_offset == 1000 + len(one)
    assert peak < 40 << 20, f"peak {peak >> 20} MiB"


def test_the_column_reader_expands_a_fetch_within_its_budget_at_real_sizes() -> None:
    """Issue 50, 5: the same eight sets read by the Spark source's decode_columns: a chunk a
    set, each taken before the next is made, the memory that of one set."""
    inner = b"".join([codec.encode_message(b"", None, 1, True)] * compression.MAX_SET_MESSAGES)
    one = Compressor(Codec.ZSTD).wrap(inner, 1)
    fetched = one * 8
    rows = []
    tracemalloc.start()
    try:
        for columns, failure in codec.decode_columns(fetched, 1000, 1 << 60):
            rows.append((columns.rows, failure))
            del columns
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rows == [(compression.MAX_SET_MESSAGES, None)] * 8
    assert peak < 16 << 20, f"peak {peak >> 20} MiB"  # 7.9 MiB; all eight at once: 41 MiB


def test_log_dump_makes_a_sets_messages_one_at_a_time() -> None:
    """Issue 50, 5: `pylogctl log dump`'s set_messages counts a set's messages and checks them
    whole, then makes them as they are taken: a set of 100,000 empty messages (more on a disk
    written before the MAX_SET_MESSAGES rule) costs the memory of its inner set, not of an
    object a message."""
    inner = b"".join([codec.encode_message(b"", None, 1, True)] * compression.MAX_SET_MESSAGES)
    wrapper = message.decode_message(Compressor(Codec.ZSTD).wrap(inner, 1), 0, 500)
    taken = 0
    tracemalloc.start()
    try:
        count, messages, failure = codec.set_messages(wrapper)
        for each in messages:
            taken += 1
            last = each
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (count, taken, failure) == (compression.MAX_SET_MESSAGES, count, None)
    assert (last.offset, last.size, last.value) == (500, wrapper.size, b"")
    assert peak < 8 << 20, f"peak {peak >> 20} MiB"


def _scanned(buf: bytes) -> tuple[bytes, message.ScanResult]:
    return buf, codec.scan(buf, 1 << 20)


def test_compressor_levels_and_names() -> None:
    assert compression.codec_named("ZSTD") is Codec.ZSTD
    with pytest.raises(ValueError, match="unknown compression 'snappy': choose one of none"):
        compression.codec_named("snappy")
    with pytest.raises(ValueError, match="zstd takes levels -7 to 22, not 23"):
        Compressor(Codec.ZSTD, 23)
    with pytest.raises(ValueError, match="gzip takes levels 0 to 9, not -1"):
        Compressor(Codec.GZIP, -1)
    with pytest.raises(ValueError, match="needs a codec other than none"):
        Compressor(Codec.NONE)


def test_the_log_counts_inner_messages_and_old_readers_stop_at_the_first_set(
    tmp_path: Path, clock: FakeClock
) -> None:
    log = open_log(tmp_path / "t-0", clock)
    log.append(make_set(0, 3))
    inner = make_set(3, 5)
    offset, count = log.append_counted(wrapped(Compressor(Codec.LZ4), inner))
    assert (offset, count) == (300, 5)
    log.append(make_set(8, 2))  # plain again after the set: still past it for old readers
    log.flush()
    assert len(log.read(0, 1 << 20, sets=False)) == 300
    assert len(log.read(100, 150, sets=False)) == 100
    with pytest.raises(UnsupportedFormat, match="t-0: the data from offset 300 on"):
        log.read(300, 1 << 20, sets=False)
    end = log.flushed_offset
    with pytest.raises(UnsupportedFormat):
        log.read(end - 100, 1 << 20, sets=False)
    assert len(log.read(0, 1 << 20)) == end
    log.close()
    log = open_log(tmp_path / "t-0", clock)  # the position is found again, by a walk
    assert len(log.read(0, 1 << 20, sets=False)) == 300
    with pytest.raises(UnsupportedFormat):
        log.read(300, 1 << 20, sets=False)
    log.truncate_to(300)  # the set cut off: old readers read the whole segment again
    log.append(make_set(3, 1))
    log.flush()
    assert len(log.read(0, 1 << 20, sets=False)) == 400
    log.close()


def recovered_after_damage(
    tmp_path: Path, clock: FakeClock, appended: list[bytes]
) -> list[message.Message]:
    """A log of two plain messages of 100 bytes then `appended`, the second message's length
    field broken (it leads nowhere) and the log opened again: the damage is that message alone,
    nothing is cut; the messages read after it."""
    log = open_log(tmp_path / "t-0", clock)
    log.append(make_set(0, 2))
    for each in appended:
        log.append(each)
    log.flush()
    log.close()
    flip(tmp_path / "t-0" / f"{0:020d}.log", 100, 0x40)
    log = open_log(tmp_path / "t-0", clock)
    assert (log.recovery.damaged, log.recovery.bytes_truncated) == (((100, 200),), 0)
    decoded, failure = codec.decode(log.read(200, 1 << 20), 200)
    assert failure is None
    log.close()
    return decoded


def test_recovery_keeps_the_sets_after_damage(tmp_path: Path, clock: FakeClock) -> None:
    """A length field broken before a run of compressed sets: recovery finds the next set by
    its magic and attributes, and keeps every set after the damage."""
    sets = [wrapped(Compressor(Codec.ZSTD), make_set(2 + 3 * i, 3)) for i in range(3)]
    decoded = recovered_after_damage(tmp_path, clock, sets)
    assert [m.value[:8] for m in decoded] == [b"%08d" % i for i in range(2, 11)]


def stored_kinds(log_dir: Path) -> list[int]:
    """The attributes of every message stored in the partition folder's first segment."""
    data = (log_dir / f"{0:020d}.log").read_bytes()
    kinds = []
    pos = 0
    while pos < len(data):
        kinds.append(data[pos + message.ATTRIBUTES_AT])
        pos += message.message_size_at(data, pos)
    return kinds


def test_a_topic_of_a_codec_stores_every_set_so(tmp_path: Path, clock: FakeClock) -> None:
    """compression zstd: plain messages and sets of another codec are stored as zstd sets,
    a zstd set as it came; counts and contents stay; compression none: sets become plain
    messages whose checksums pass."""
    log = open_log(tmp_path / "t-0", clock, compression="zstd")
    zstd_set = wrapped(Compressor(Codec.ZSTD, 19), make_set(5, 3))
    assert log.append_counted(make_set(0, 3))[1] == 3
    assert log.append_counted(wrapped(Compressor(Codec.GZIP), make_set(3, 2)))[1] == 2
    start = log.log_end_offset
    assert log.append_counted(zstd_set)[1] == 3
    log.flush()
    assert bytes(log.read(start, 1 << 20)) == zstd_set  # kept as it came: its level too
    assert stored_kinds(tmp_path / "t-0") == [Codec.ZSTD] * 3
    decoded, failure = codec.decode(log.read(0, 1 << 20), 0)
    assert failure is None
    assert [m.value[:8] for m in decoded] == [b"%08d" % i for i in range(8)]
    log.local.reconfigure(dataclasses.replace(log.local.config, compression="none"))
    mixed = make_set(8, 1) + wrapped(Compressor(Codec.LZ4), make_set(9, 2))
    assert log.append_counted(mixed)[1] == 3
    log.flush()
    assert stored_kinds(tmp_path / "t-0")[3:] == [0, 0, 0]
    result = codec.scan(log.read(0, 1 << 20), 1 << 20)
    assert (result.error, result.message_count) == (None, 6)
    everything = []
    offset = 0
    while offset < log.flushed_offset:
        decoded, failure = codec.decode(log.read(offset, 1 << 20), offset)
        assert failure is None
        everything += decoded
        offset = decoded[-1].next_offset
    assert [m.value[:8] for m in everything] == [b"%08d" % i for i in range(11)]
    log.close()


def test_a_topic_setting_of_compression_takes_its_choices_only() -> None:
    assert topic_settings({"compression": "lz4"}) == {"compression": "lz4"}
    with pytest.raises(InvalidTopic, match="compression must be one of producer, none, gzip"):
        topic_settings({"compression": "snappy"})
    with pytest.raises(ValueError, match="compression must be one of"):
        LogConfig(compression="ZSTD")


def test_recovery_cuts_a_torn_set_and_the_time_index_finds_sets(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A crash that tore the last compressed set: recovery keeps the sets before it whole and
    cuts only the torn one; a lookup by time lands on the set holding the first message at or
    after the time (a set's timestamp is its greatest)."""
    log = open_log(tmp_path / "t-0", clock, index_interval_bytes=64)
    sets = [wrapped(Compressor(Codec.ZSTD), make_set(10 * i, 10)) for i in range(4)]
    for each in sets:
        log.append(each)
    log.flush()
    starts = [sum(len(s) for s in sets[:i]) for i in range(4)]
    assert log.offset_for_timestamp(0) == 0
    assert log.offset_for_timestamp(15) == starts[1]  # messages 10-19: the second set
    assert log.offset_for_timestamp(19) == starts[1]
    assert log.offset_for_timestamp(20) == starts[2]
    assert log.offset_for_timestamp(1000) == log.flushed_offset
    path = tmp_path / "t-0" / f"{0:020d}.log"
    log.close()
    path.write_bytes(path.read_bytes()[: starts[3] + len(sets[3]) // 2])  # a torn last set
    log = open_log(tmp_path / "t-0", clock, index_interval_bytes=64)
    assert (log.flushed_offset, log.recovery.bytes_truncated) == (starts[3], len(sets[3]) // 2)
    decoded, failure = codec.decode(log.read(0, 1 << 20), 0)
    assert failure is None
    assert [m.value[:8] for m in decoded] == [b"%08d" % i for i in range(30)]
    log.close()


def test_recovery_keeps_the_messages_with_headers_after_damage(
    tmp_path: Path, clock: FakeClock
) -> None:
    """As for sets: recovery finds the next message of format 2 by its magic and attributes."""
    headed = [
        message.encode_message(b"h%d" % i, None, i, False, [("n", b"%d" % i)]) for i in range(3)
    ]
    decoded = recovered_after_damage(tmp_path, clock, headed)
    assert [(m.value, m.headers) for m in decoded] == [
        (b"h%d" % i, (("n", b"%d" % i),)) for i in range(3)
    ]
