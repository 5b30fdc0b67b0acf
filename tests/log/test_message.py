"""The message format: encoding, decoding, and validation of a producer's message set."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from xxhash import xxh3_64_intdigest

from broker.errors import InvalidMessage, MessageTooLarge
from broker.log.message import (
    CHECKSUM_START,
    HEADER_SIZE,
    decode_message,
    encode_message,
    iter_messages,
    scan,
    validate_message_set,
)

MAX = 1 << 20

messages = st.tuples(
    st.binary(max_size=300),
    st.none() | st.binary(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)


def rechecksum(message: bytearray) -> bytearray:
    """Fix the checksum after a test changed a field on purpose (to reach a later check)."""
    struct.pack_into(">Q", message, 4, xxh3_64_intdigest(bytes(message[CHECKSUM_START:])))
    return message


@given(st.lists(messages, min_size=1, max_size=20))
def test_encoded_sets_decode_to_what_was_encoded_at_byte_offsets(
    batch: list[tuple[bytes, bytes | None, int]],
) -> None:
    encoded = [encode_message(v, key=k, timestamp_ms=t) for v, k, t in batch]
    base = 12345
    decoded = list(iter_messages(b"".join(encoded), base))
    assert [(m.value, m.key, m.timestamp_ms) for m in decoded] == batch
    expected_offsets = [base + sum(len(e) for e in encoded[:i]) for i in range(len(encoded))]
    assert [m.offset for m in decoded] == expected_offsets
    assert all(m.size == len(e) for m, e in zip(decoded, encoded, strict=True))
    assert validate_message_set(b"".join(encoded), MAX).message_count == len(batch)


def test_a_message_without_key_differs_from_one_with_an_empty_key() -> None:
    no_key = next(iter_messages(encode_message(b"v", key=None, timestamp_ms=0)))
    empty_key = next(iter_messages(encode_message(b"v", key=b"", timestamp_ms=0)))
    assert (no_key.key, empty_key.key) == (None, b"")


def test_header_is_26_bytes_and_length_counts_what_follows() -> None:
    message = encode_message(b"abc", key=b"k", timestamp_ms=7)
    assert len(message) == HEADER_SIZE + 1 + 3
    assert struct.unpack_from(">I", message)[0] == len(message) - 4


def invalid_reason(data: bytes, max_message_bytes: int = MAX) -> tuple[int, str]:
    with pytest.raises(InvalidMessage) as caught:
        validate_message_set(data, max_message_bytes)
    return caught.value.position, caught.value.reason


GOOD = encode_message(b"first value", key=b"key", timestamp_ms=1)


def test_flipped_value_byte_is_a_checksum_mismatch_at_that_message() -> None:
    bad = bytearray(encode_message(b"second value", timestamp_ms=2))
    bad[-3] ^= 0x01
    position, reason = invalid_reason(GOOD + bytes(bad) + GOOD)
    assert position == len(GOOD)
    assert "checksum mismatch" in reason


def test_cut_short_message_is_rejected() -> None:
    assert invalid_reason(GOOD + GOOD[:-1]) == (
        len(GOOD),
        f"cut short: the message needs {len(GOOD)} bytes, {len(GOOD) - 1} are left",
    )
    assert invalid_reason(GOOD + GOOD[:10])[1].startswith("cut short: 10 bytes left")


def test_zero_length_record_is_rejected() -> None:
    position, reason = invalid_reason(GOOD + bytes(HEADER_SIZE))
    assert position == len(GOOD)
    assert reason == "length field 0 is below the minimum 22"


def test_unknown_version_and_compression_and_reserved_bits_are_rejected() -> None:
    """Codecs 1, 3 and 4 make a compressed set, whose inner set broker.log.codec.check_sets
    checks (tests/log/test_compression.py); the others are refused by the walk."""
    for byte, value, expected in (
        (12, 3, "unknown format version (magic) 3"),
        (12, 2, "header block: headers_length 1718186611 does not fit in the message"),
        (13, 2, "unsupported compression codec 2 (snappy, which pylog does not take)"),
        (13, 7, "unsupported compression codec 7"),
        (13, 0x80, "reserved attribute bits set: 0x80"),
        (13, 0x81, "reserved attribute bits set: 0x81"),
    ):
        bad = bytearray(GOOD)
        bad[byte] = value
        assert invalid_reason(bytes(rechecksum(bad))) == (0, expected)


def test_key_length_that_does_not_fit_is_rejected() -> None:
    for key_length in (len(GOOD), -2):
        bad = bytearray(GOOD)
        struct.pack_into(">i", bad, 22, key_length)
        position, reason = invalid_reason(bytes(rechecksum(bad)))
        assert (position, reason.split(" does")[0]) == (0, f"key length {key_length}")


def test_message_over_max_message_bytes_is_too_large_naming_its_position_and_both_sizes() -> None:
    big = encode_message(b"x" * 100, timestamp_ms=0)
    with pytest.raises(MessageTooLarge) as raised:
        validate_message_set(GOOD + big, len(big) - 1)
    assert (raised.value.size, raised.value.limit) == (len(big), len(big) - 1)
    assert f"at byte {len(GOOD)}" in str(raised.value)


def test_empty_set_is_rejected() -> None:
    assert invalid_reason(b"") == (0, "the message set is empty")


def test_scan_keeps_the_valid_prefix_and_marks_index_entries_by_interval() -> None:
    one = encode_message(b"v" * 74, timestamp_ms=0)  # 100 bytes on disk
    data = one * 10 + b"garbage"
    result = scan(data, MAX, index_interval=250)
    assert (result.valid_bytes, result.message_count) == (1000, 10)
    assert result.marks == [0, 300, 600, 900]
    assert result.error is not None and result.error.startswith("cut short")


def test_decode_reports_a_bad_checksum_instead_of_raising() -> None:
    bad = bytearray(GOOD)
    bad[-1] ^= 0xFF
    message = decode_message(bytes(bad), 0, 500)
    assert (message.offset, message.checksum_ok, message.key) == (500, False, b"key")
