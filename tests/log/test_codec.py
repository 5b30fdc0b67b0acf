"""The C codec (broker/log/_codec.c) against its Python references in broker.log.message: the
same results, exceptions included, on valid and on corrupt input; and which one is in use.

Both are imported directly, so this runs both whatever PYLOG_CODEC says."""

from __future__ import annotations

import gc
import os
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xxhash import xxh3_64_intdigest

from broker.client.records import Record
from broker.errors import InvalidMessage
from broker.log import _codec, codec, columns, compression, message
from broker.log.message import HEADER_SIZE, MAX_FORMAT_MESSAGE_BYTES, decode_failure, scan_result
from tests.log.test_compression import wrapped

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1

keys = st.one_of(
    st.none(), st.just(b""), st.binary(max_size=40), st.binary(min_size=300, max_size=600)
)
timestamps = st.one_of(
    st.sampled_from([I64_MIN, I64_MIN + 1, -1, 0, 1, I64_MAX - 1, I64_MAX]),
    st.sampled_from([I64_MAX // 1000, I64_MAX // 1000 + 1, -(I64_MAX // 1000), I64_MIN // 1000]),
    st.integers(I64_MIN, I64_MAX),
)
messages = st.tuples(st.binary(max_size=300), keys, timestamps)
RECORD = (Record, "topic", 7)
"""decode_records' record type, topic and partition in these checks."""
buffer_kinds: list[Callable[[bytes], Any]] = [bytes, bytearray, memoryview]


def encoded(batch: list[tuple[bytes, bytes | None, int]], inner: bool = False) -> bytes:
    return b"".join(message.encode_message(value, key, ts, inner) for value, key, ts in batch)


def outcome(function: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """What calling `function` gives: its result, or its exception's type and text."""
    try:
        return "returned", function(*args)
    except Exception as error:
        return "raised", (type(error), str(error))


def same(python: Callable[..., Any], c: Callable[..., Any], *args: Any) -> Any:
    expected = outcome(python, *args)
    assert outcome(c, *args) == expected
    return expected


def c_scan(buf: Any, max_message_bytes: int, interval: int, mark: int) -> message.ScanResult:
    return scan_result(
        buf, max_message_bytes, _codec.scan_walk(buf, max_message_bytes, interval, mark, False)
    )


def check_all(
    data: bytes, max_message_bytes: int = 1 << 20, interval: int = 0, mark: int = 0
) -> None:
    """Every function of both implementations on `data` as bytes, bytearray and memoryview,
    and with what decode_fetched and the Spark source make of a failure."""
    for kind in buffer_kinds:
        buf = kind(data)
        for inner in (False, True):
            same(message.scan_walk, _codec.scan_walk, buf, max_message_bytes, interval, mark, inner)
        same(message.scan, c_scan, buf, max_message_bytes, interval, mark)
        same(message.decode_set, _codec.decode_set, buf, 1000, 0, 7)  # as an inner set
        kind_, decoded = same(message.decode_set, _codec.decode_set, buf, 1000, 0, -1)
        for set_size in (7, -1):
            same(message.decode_records, _codec.decode_records, buf, 1000, 0, set_size, *RECORD)
        if kind_ == "returned" and decoded[1] is not None:
            failure = decode_failure(buf, decoded[1])
            with pytest.raises(InvalidMessage) as raised:
                list(message.iter_messages(buf, 1000))
            assert (failure.position, failure.reason) == (
                raised.value.position,
                raised.value.reason,
            )
        for end in (1000, 1000 + len(data) // 2, 1000 + len(data), I64_MAX):
            same(columns.decode_columns, _codec.decode_columns, [(buf, 1000, -1)], end)


@given(st.lists(messages, max_size=20), st.integers(0, 400), st.integers(-50, 400))
@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_valid_sets(batch: list[tuple[bytes, bytes | None, int]], interval: int, mark: int) -> None:
    for value, key, ts in batch:
        same(message.encode_message, _codec.encode_message, value, key, ts)
        _, made = same(message.encode_message, _codec.encode_message, value, key, ts, True)
        assert made[4:12] == bytes(8)
    inner = encoded(batch, True)
    _, walked = same(message.scan_walk, _codec.scan_walk, inner, len(inner), 0, 0, True)
    assert walked[:2] == (len(inner), len(batch))
    data = encoded(batch)
    check_all(data, MAX_FORMAT_MESSAGE_BYTES, interval, mark)
    walk = (data, MAX_FORMAT_MESSAGE_BYTES, 0, 0, False)
    _, walked = same(message.scan_walk, _codec.scan_walk, *walk)
    greatest = [max((t for _, _, t in batch), default=I64_MIN)]
    assert walked == (len(data), len(batch), [], greatest, -1, -1)


@given(st.lists(messages, min_size=1, max_size=6), st.data())
@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
def test_bit_flips(batch: list[tuple[bytes, bytes | None, int]], data: st.DataObject) -> None:
    buf = bytearray(encoded(batch))
    for _ in range(data.draw(st.integers(1, 3))):
        bit = data.draw(st.integers(0, len(buf) * 8 - 1))
        buf[bit // 8] ^= 1 << (bit % 8)
    check_all(bytes(buf))


@given(st.lists(messages, min_size=1, max_size=3))
@settings(deadline=None, max_examples=30, suppress_health_check=[HealthCheck.too_slow])
def test_truncation_at_every_position(batch: list[tuple[bytes, bytes | None, int]]) -> None:
    data = encoded(batch)
    for cut in range(len(data) + 1):
        for kind in buffer_kinds:
            buf = kind(data[:cut])
            same(message.scan_walk, _codec.scan_walk, buf, 1 << 20, 0, 0, False)
            same(message.decode_set, _codec.decode_set, buf, 7, 0, -1)
            same(columns.decode_columns, _codec.decode_columns, [(buf, 7, -1)], I64_MAX)


@given(st.binary(max_size=200))
@settings(deadline=None)
def test_random_bytes(data: bytes) -> None:
    check_all(data)


@given(st.lists(messages, min_size=1, max_size=3), st.data())
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_header_fields_out_of_range(
    batch: list[tuple[bytes, bytes | None, int]], data: st.DataObject
) -> None:
    """A header field of one message set to a value at or past its limits: the length below
    the minimum or past the end, key_length out of range, magic and attributes wrong."""
    buf = bytearray(encoded(batch))
    starts = [0]
    for value, key, _ in batch[:-1]:
        starts.append(starts[-1] + HEADER_SIZE + len(key or b"") + len(value))
    at = data.draw(st.sampled_from(starts))
    length = struct.unpack_from(">I", buf, at)[0]
    field = data.draw(st.sampled_from(["length", "key_length", "magic", "attributes"]))
    if field == "length":
        value = data.draw(st.sampled_from([0, 21, 22, length - 1, length + 1, len(buf), 2**32 - 1]))
        struct.pack_into(">I", buf, at, value)
    elif field == "key_length":
        value = data.draw(
            st.sampled_from([-2, -1, 0, length - 22, length - 21, 2**31 - 1, -(2**31)])
        )
        struct.pack_into(">i", buf, at + 22, value)
    else:
        struct.pack_into(
            ">B", buf, at + (12 if field == "magic" else 13), data.draw(st.integers(0, 255))
        )
    length = struct.unpack_from(">I", buf, at)[0]
    if data.draw(st.booleans()) and at + 4 + length <= len(buf):  # reach the checks past it
        struct.pack_into(">Q", buf, at + 4, xxh3_64_intdigest(buf[at + 12 : at + 4 + length]))
    check_all(bytes(buf))


def test_lengths_below_the_minimum_with_their_checksum() -> None:
    """A length field below MIN_LENGTH whose (short) checksummed span matches: only the
    length check stops it."""
    for length in range(8, message.MIN_LENGTH + 1):
        for key_length in (-1, 0):
            buf = bytearray(struct.pack(">IQBBqi", length, 0, 1, 0, 5, key_length) + b"v" * 8)
            struct.pack_into(">Q", buf, 4, xxh3_64_intdigest(buf[12 : 4 + length]))
            check_all(bytes(buf))


@given(st.lists(messages, min_size=1, max_size=4), st.integers(-2, 3))
@settings(deadline=None)
def test_max_message_bytes_edges(batch: list[tuple[bytes, bytes | None, int]], delta: int) -> None:
    data = encoded(batch)
    largest = max(HEADER_SIZE + len(key or b"") + len(value) for value, key, _ in batch)
    for limit in (largest + delta, 0, 3, 4, -5, I64_MIN, I64_MAX, 1 << 70, -(1 << 70)):
        for kind in buffer_kinds:
            same(message.scan, c_scan, kind(data), limit, 0, 0)
            same(message.validate_message_set, codec_validate_c, kind(data), limit)


def codec_validate_c(buf: Any, max_message_bytes: int) -> message.ScanResult:
    return message.validated(buf, max_message_bytes, c_scan(buf, max_message_bytes, 0, 0))


def test_marks_with_extreme_intervals() -> None:
    data = encoded([(b"v" * 10, None, 5)] * 5)
    for interval in (0, 1, -1, I64_MAX, 1 << 80, -(1 << 80)):
        for mark in (I64_MIN, -1, 0, 36, I64_MAX, 1 << 80, -(1 << 80)):
            same(message.scan_walk, _codec.scan_walk, data, 1 << 20, interval, mark, False)


def test_offsets_past_int64() -> None:
    data = encoded([(b"v", b"k", 1)] * 3)
    for base in (I64_MAX - 10, I64_MAX, 1 << 70, I64_MIN, -(1 << 70)):
        same(message.decode_set, _codec.decode_set, data, base, 0, -1)
        same(message.decode_set, _codec.decode_set, data, base, 0, 99)
        for set_size in (-1, 99):
            same(message.decode_records, _codec.decode_records, data, base, 0, set_size, *RECORD)
        for end in (base, base + 30, I64_MAX, 1 << 80):
            for size in (-1, 99):
                same(columns.decode_columns, _codec.decode_columns, [(data, base, size)], end)


@pytest.mark.parametrize(
    ("value", "key", "ts"),
    [
        (b"v", b"k", 2**63),
        (b"v", None, -(2**63) - 1),
        (b"v", b"k", 1.5),
        (b"v", "k", 1),
        ("v", b"k", 1),
        ("v", None, 1),
        (b"v", 3, 1),
        (b"v", b"k", "1"),
        (3, None, None),
        (memoryview(b"v"), bytearray(b"k"), True),
    ],
)
def test_encode_refusals(value: Any, key: Any, ts: Any) -> None:
    kind, result = same(message.encode_message, _codec.encode_message, value, key, ts)
    if kind == "returned":
        assert result == message.encode_message(bytes(value), bytes(key), int(ts))


def test_encode_keywords_and_default_timestamp() -> None:
    before = message.timestamp_at(message.encode_message(b"x"), 0)
    made = _codec.encode_message(value=b"x", key=b"k")
    after = message.timestamp_at(message.encode_message(b"x"), 0)
    assert before <= message.timestamp_at(made, 0) <= after
    assert made == message.encode_message(b"x", b"k", message.timestamp_at(made, 0))
    assert _codec.encode_message(b"x", timestamp_ms=5) == message.encode_message(b"x", None, 5)
    encode: Any = _codec.encode_message  # called below in ways its type refuses
    with pytest.raises(TypeError, match="unexpected keyword argument 'nope'"):
        encode(b"x", nope=1)
    with pytest.raises(TypeError, match="multiple values for argument 'value'"):
        encode(b"x", value=b"y")
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        encode()


def test_decoded_message_is_a_message() -> None:
    [decoded], bad = _codec.decode_set(encoded([(b"value", b"key", 42)]), 10, 0, -1)
    assert bad is None
    assert type(decoded) is message.Message
    assert not gc.is_tracked(decoded)  # it can be in no cycle: the collector need not visit it
    assert decoded.next_offset == 10 + decoded.size
    assert decoded._replace(offset=0).offset == 0


def test_decoded_records_are_the_decoded_messages_as_records() -> None:
    """decode_records makes, from the bytes, what a group member hands out: each message's
    Record, the next offset its offset plus its size (an inner set's: the set's offset, and
    past the set for its last message)."""
    batch: list[tuple[bytes, bytes | None, int]] = [(b"value", b"key", 42), (b"other", None, 43)]
    for set_size in (-1, 99):  # plain, and an inner set's
        data = encoded(batch, inner=set_size >= 0)
        messages, _ = _codec.decode_set(data, 10, 0, set_size)
        records, bad = _codec.decode_records(data, 10, 0, set_size, Record, "t", 3)
        assert bad is None
        expected = [
            Record("t", 3, m.offset, m.timestamp_ms, m.key, m.value, m.headers, m.next_offset)
            for m in messages
        ]
        assert records == expected and all(type(r) is Record for r in records)
        assert not any(gc.is_tracked(r) for r in records)
    assert [r.next_offset for r in records] == [10, 10 + 99]


@pytest.mark.parametrize(
    ("record_type", "topic", "partition", "refused"),
    [
        (list, "t", 0, "a tuple type without __dict__"),
        (type("WithDict", (tuple,), {}), "t", 0, "a tuple type without __dict__"),
        (Record, b"t", 0, "topic is a str"),
        (Record, "t", 0.0, "partition an int"),
        (Record, "t", True, "partition an int"),
    ],
)
def test_decode_records_refuses_what_it_cannot_make(
    record_type: Any, topic: Any, partition: Any, refused: str
) -> None:
    data = encoded([(b"v", None, 1)])
    kind, (error, text) = same(
        message.decode_records, _codec.decode_records, data, 0, 0, -1, record_type, topic, partition
    )
    assert (kind, error) == ("raised", TypeError) and refused in text


def test_repeated_decoding_does_not_grow_memory() -> None:
    """Leak sanity: every object the C functions make is freed with its result."""
    data = encoded([(b"v" * 174, None, 1)] * 1000 + [(b"v" * 100, b"key", 2)] * 100)
    corrupt = data[:-1]
    for _ in range(3):  # warm up: caches, free lists
        run_everything(data, corrupt)
    gc.collect()
    tracemalloc.start()
    try:
        run_everything(data, corrupt)
        gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        for _ in range(50):
            run_everything(data, corrupt)
        gc.collect()
        last, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert last - first < 64 * 1024, f"grew by {last - first} bytes over 50 rounds"


def run_everything(data: bytes, corrupt: bytes) -> None:
    for buf in (data, corrupt, memoryview(data)):
        _codec.scan_walk(buf, 1 << 20, 4096, 0, False)
        _codec.scan_walk(buf, 1 << 20, 4096, 0, True)
        _codec.decode_set(buf, 0, 0, -1)
        _codec.decode_set(buf, 0, 0, 40)
        _codec.decode_records(buf, 0, 0, -1, *RECORD)
        _codec.decode_records(buf, 0, 0, 40, *RECORD)
        _codec.decode_columns([(buf, 0, -1), (buf, 10, 40)], I64_MAX)
    for i in range(200):
        _codec.encode_message(b"v" * 100, b"k" if i % 2 else None, i)
    for bad in ((b"v", b"k", 2**63), ("v", None, 1)):
        with pytest.raises((TypeError, struct.error)):
            _codec.encode_message(*bad)


def test_setup_built_the_extension() -> None:
    """What tells that the README's setup (scripts/setup: CI runs it on a fresh clone) built
    the C codec, and that it is in use unless PYLOG_CODEC=python says otherwise."""
    assert _codec.__file__ is not None and _codec.__file__.endswith(".so")
    expected = "python" if os.environ.get("PYLOG_CODEC") == "python" else "c"
    assert expected == codec.IMPLEMENTATION


def implementation_with(
    environment: dict[str, str], hide_extension: bool
) -> subprocess.CompletedProcess[str]:
    hide = "import sys; sys.modules['broker.log._codec'] = None; " if hide_extension else ""
    return subprocess.run(
        [sys.executable, "-c", hide + "from broker.log import codec; print(codec.IMPLEMENTATION)"],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.broker
@pytest.mark.parametrize(
    ("choice", "hidden", "expected"),
    [("", False, "c"), ("python", False, "python"), ("c", False, "c"), ("", True, "python")],
)
def test_pylog_codec_chooses(choice: str, hidden: bool, expected: str) -> None:
    result = implementation_with({"PYLOG_CODEC": choice}, hidden)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == expected


@pytest.mark.broker
def test_pylog_codec_c_without_the_extension_says_what_to_install() -> None:
    result = implementation_with({"PYLOG_CODEC": "c"}, hide_extension=True)
    assert result.returncode != 0
    assert "ImportError: PYLOG_CODEC=c: the C codec broker.log._codec is not built" in result.stderr
    assert "libxxhash-dev" in result.stderr


@pytest.mark.broker
def test_pylog_codec_unknown_value() -> None:
    result = implementation_with({"PYLOG_CODEC": "rust"}, hide_extension=False)
    assert "PYLOG_CODEC must be c or python, not 'rust'" in result.stderr


def test_storage_walks_use_the_codec() -> None:
    """Recovery, `pylogctl log verify` and a producer's set's validation walk with the codec
    chosen (the C one, built), not with broker.log.message's."""
    from broker.log import partition, segment_scan, verify

    assert vars(segment_scan)["scan"] is codec.scan
    assert vars(verify)["scan"] is codec.scan
    assert vars(partition)["validate_message_set"] is codec.validate_message_set


def test_consumers_decode_with_the_codec() -> None:
    """decode_fetched (the consumers', the group's, lag's) decodes with the codec chosen."""
    from broker.client import consumer

    assert vars(consumer)["decode"] is codec.decode


@given(st.lists(messages, max_size=12), st.integers(0, 2000))
@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
def test_the_spark_sources_record_batch_is_its_messages(
    batch: list[tuple[bytes, bytes | None, int]], cut: int
) -> None:
    """The Spark source's record batch, made from decode_columns' buffers (C and Python),
    holds the rows that Arrow makes of the decoded messages below the range's end."""
    pa = pytest.importorskip("pyarrow")
    reader = pytest.importorskip("pipeline.reader")
    from pipeline.cluster import SourcePartition

    # timestamps / 1000, rounded toward 0: within the range of microseconds in an int64
    batch = [(value, key, ts // 1000 if ts >= 0 else -(-ts // 1000)) for value, key, ts in batch]
    data = encoded(batch)
    tp = SourcePartition("clicks", 3)
    expected_rows = [m for m in message.iter_messages(data, 100) if m.offset < 100 + cut]
    expected = pa.RecordBatch.from_arrays(
        [
            pa.array([m.key for m in expected_rows], pa.binary()),
            pa.array([m.value for m in expected_rows], pa.binary()),
            pa.array(["clicks"] * len(expected_rows), pa.string()),
            pa.array([3] * len(expected_rows), pa.int32()),
            pa.array([m.offset for m in expected_rows], pa.int64()),
            pa.array([m.timestamp_ms * 1000 for m in expected_rows], reader.ARROW_SCHEMA[5].type),
            pa.array([0] * len(expected_rows), pa.int32()),
        ],
        schema=reader.ARROW_SCHEMA,
    )
    for decode_columns in (columns.decode_columns, _codec.decode_columns):
        made = reader._record_batch(decode_columns([(data, 100, -1)], 100 + cut), tp)
        made.validate(full=True)
        assert made.equals(expected)


def test_the_spark_source_decodes_with_the_codec() -> None:
    reader = pytest.importorskip("pipeline.reader")
    assert vars(reader)["decode_columns"] is codec.decode_columns


def test_producers_encode_with_the_codec() -> None:
    """Producer.send and AsyncProducer.send (ProducerCore._add) encode with the codec chosen."""
    from broker.client import producer_core

    assert vars(producer_core)["encode_message"] is codec.encode_message


@given(
    st.lists(messages, max_size=4),
    st.lists(messages, min_size=1, max_size=4),
    st.lists(messages, max_size=4),
    st.data(),
)
@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_pieces_with_an_inner_set(
    before: list[tuple[bytes, bytes | None, int]],
    inner: list[tuple[bytes, bytes | None, int]],
    after: list[tuple[bytes, bytes | None, int]],
    data: st.DataObject,
) -> None:
    """decode_set of an inner set (every message at the set's offset, size 0 but the last)
    and decode_columns of pieces holding one, both implementations alike, whole and with a
    bit of the inner set flipped. Whole, its messages are read as written. Flipped, what the
    two read is all that is asked: inner messages carry no checksum (their wrapper's covers
    them), so a flip can frame them anew, one message's length taking in the next whole (a
    run on 2026-12-01 drew one)."""
    first, middle, last = encoded(before), bytearray(encoded(inner, True)), encoded(after)
    flipped = data.draw(st.booleans())
    if flipped:
        bit = data.draw(st.integers(0, len(middle) * 8 - 1))
        middle[bit // 8] ^= 1 << (bit % 8)
    size = len(middle) // 2 + 30
    for kind in buffer_kinds:
        buf = kind(bytes(middle))
        same(message.decode_set, _codec.decode_set, buf, 500, 0, size)
        pieces = [(kind(first), 0, -1), (buf, 500, size), (kind(last), 500 + size, -1)]
        for end in (0, 1, 500, 501, 500 + size + len(last) // 2, I64_MAX):
            same(columns.decode_columns, _codec.decode_columns, pieces, end)
    decoded, bad = _codec.decode_set(bytes(middle), 500, 0, size)
    if not flipped:
        assert bad is None
        assert [(m.offset, m.size) for m in decoded] == [(500, 0)] * (len(inner) - 1) + [
            (500, size)
        ]


@given(st.lists(messages, min_size=1, max_size=6), st.data())
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_decode_from_a_start(
    batch: list[tuple[bytes, bytes | None, int]], data: st.DataObject
) -> None:
    buf = encoded(batch)
    start = data.draw(st.integers(-1, len(buf) + 1))
    same(message.decode_set, _codec.decode_set, buf, 40, start, -1)


def test_a_compressed_set_is_one_message_to_the_walk_and_stops_the_decoders() -> None:
    plain = encoded([(b"a", None, 1), (b"b", b"k", 2)])
    wrapper = wrapped(compression.Compressor(compression.Codec.ZSTD), plain)
    data = plain + wrapper + plain
    _, walked = same(message.scan_walk, _codec.scan_walk, data, 1 << 20, 0, 0, False)
    assert walked == (len(data), 5, [], [2], len(plain), len(plain))
    _, (decoded, bad) = same(message.decode_set, _codec.decode_set, data, 0, 0, -1)
    assert (len(decoded), bad) == (2, len(plain))
    check_all(data)
    nested = wrapped(compression.Compressor(compression.Codec.LZ4), wrapper)
    _, (decoded, bad) = same(message.decode_set, _codec.decode_set, nested, 0, 0, -1)
    assert (decoded, bad) == ([], 0)


header_lists = st.lists(
    st.tuples(
        st.text(max_size=8),
        st.none() | st.binary(max_size=20),
    ),
    max_size=4,
)
messages_v2 = st.tuples(st.binary(max_size=100), keys, timestamps, st.none() | header_lists)


def encoded_v2(batch: list[tuple[bytes, bytes | None, int, Any]], inner: bool = False) -> bytes:
    """Messages of format 2 where headers are given (an empty list too), else format 1."""
    return b"".join(
        message.encode_message(value, key, ts, inner, headers) for value, key, ts, headers in batch
    )


@given(st.lists(messages_v2, max_size=8), st.data())
@settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])
def test_format_2_messages_alike_valid_and_damaged(
    batch: list[tuple[bytes, bytes | None, int, Any]], data: st.DataObject
) -> None:
    """Messages with headers among plain ones: both implementations read the same headers,
    stop at the same damaged one (a flipped bit, its checksum made good: damage the framing
    and header block checks must find), and give the same Arrow buffers."""
    buf = bytearray(encoded_v2(batch))
    check_all(bytes(buf))
    decoded = message.decode_set(bytes(buf), 0, 0, -1)[0]
    assert [m.headers for m in decoded] == [tuple(h or ()) for _, _, _, h in batch]
    if buf:
        bit = data.draw(st.integers(0, len(buf) * 8 - 1))
        buf[bit // 8] ^= 1 << (bit % 8)
        pos = 0
        while pos + 26 <= len(buf):  # checksums made good where the framing still leads
            length = struct.unpack_from(">I", buf, pos)[0]
            if pos + 4 + length > len(buf):
                break
            struct.pack_into(
                ">Q", buf, pos + 4, xxh3_64_intdigest(buf[pos + 12 : pos + 4 + length])
            )
            pos += 4 + length
        check_all(bytes(buf))
    inner = encoded_v2(batch, True)
    same(message.decode_set, _codec.decode_set, inner, 10, 0, len(inner) + 40)


def test_header_keys_must_be_strict_utf8() -> None:
    """The C walk takes a header key as Python's strict UTF-8 decoder does: no overlong forms,
    surrogates or code points past U+10FFFF."""
    for key in (
        b"\xc0\xaf",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xe0\x80\xaf",
        b"\xff",
        b"\xc3",
        b"ok\xe2\x82",
        "é€😀".encode(),
    ):
        body = bytearray(message.encode_message(b"v", None, 1, False, [("x" * len(key), b"")]))
        at = body.index(b"x" * len(key))
        body[at : at + len(key)] = key
        struct.pack_into(">Q", body, 4, xxh3_64_intdigest(body[12:]))
        check_all(bytes(body))
        valid = message.scan(bytes(body), 1 << 20).error is None
        assert valid == (key == "é€😀".encode()), key


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("k", b"v"), ("n", None)],
        {"a": b"1"}.items(),
        [["list", bytearray(b"pair")], ("view", memoryview(b"mv"))],
        iter([("gen", b"x")]),
        [(b"k", b"v")],
        [("k", "text")],
        ["k"],
        [("a", b"1", "extra")],
        [3],
        [("k" * 70000, b"")],
        [("\ud800", b"")],
        3,
        [("k", 5)],
    ],
)
def test_encoding_headers_alike(headers: Any) -> None:
    """encode_message with headers: the C codec and its reference make the same bytes and
    refuse the same headers with the same error."""
    items: Any = list(headers) if not isinstance(headers, int) else headers
    kind, made = same(message.encode_message, _codec.encode_message, b"v", b"k", 9, False, items)
    if kind == "returned":
        (decoded,) = message.decode_set(made, 0, 0, -1)[0]
        assert decoded.headers == tuple((k, None if v is None else bytes(v)) for k, v in items)
