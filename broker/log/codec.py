"""The message format's hot loops, from the C extension broker.log._codec when it is built,
else from their Python references in broker.log.message (docs/storage.md, "The codec").

Both give the same results, exceptions included (tests/log/test_codec.py). `PYLOG_CODEC=python`
in the environment takes the Python ones (for comparisons, and as the way out should the C ones
misbehave); `PYLOG_CODEC=c` makes a missing extension an ImportError that says how to build it.
`IMPLEMENTATION` says which is in use: "c" or "python".
"""

from __future__ import annotations

import os
from typing import Final

from broker.errors import InvalidMessage
from broker.log import message
from broker.log.message import Buffer, Columns, Message, ScanResult, decode_failure, validated

_CHOICE = os.environ.get("PYLOG_CODEC", "")
if _CHOICE not in ("", "c", "python"):
    raise ImportError(f"PYLOG_CODEC must be c or python, not {_CHOICE!r}")

_BUILD_HINT = (
    "the C codec broker.log._codec is not built: install gcc, the Python headers "
    "(python3-dev) and libxxhash-dev (scripts/setup does), then `pip install -e .` again"
)

if _CHOICE == "python":
    from broker.log import message as _impl
else:
    try:
        from broker.log import _codec as _impl  # type: ignore[no-redef]
    except ImportError as error:
        if _CHOICE == "c":
            raise ImportError(f"PYLOG_CODEC=c: {_BUILD_HINT} ({error})") from error
        from broker.log import message as _impl

IMPLEMENTATION: Final = "c" if _impl is not message else "python"

encode_message: Final = _impl.encode_message
"""encode_message(value, key=None, timestamp_ms=None): broker.log.message.encode_message."""
_scan_walk: Final = _impl.scan_walk
_decode_set: Final = _impl.decode_set
_decode_columns: Final = _impl.decode_columns


def scan(
    buf: Buffer, max_message_bytes: int, index_interval: int = 0, next_mark: int = 0
) -> ScanResult:
    """broker.log.message.scan."""
    walked = _scan_walk(buf, max_message_bytes, index_interval, next_mark)
    return message.scan_result(buf, max_message_bytes, walked)


def validate_message_set(
    buf: Buffer, max_message_bytes: int, index_interval: int = 0, next_mark: int = 0
) -> ScanResult:
    """broker.log.message.validate_message_set."""
    return validated(
        buf, max_message_bytes, scan(buf, max_message_bytes, index_interval, next_mark)
    )


def decode(buf: Buffer, base_offset: int) -> tuple[list[Message], InvalidMessage | None]:
    """The messages of a set whose first byte is at `base_offset`, as iter_messages gives
    them, up to the first that fails its checks, and what iter_messages raises there (None
    when all pass)."""
    messages, bad = _decode_set(buf, base_offset)
    return messages, None if bad is None else decode_failure(buf, bad)


def decode_columns(
    buf: Buffer, base_offset: int, end_offset: int
) -> tuple[Columns, InvalidMessage | None]:
    """broker.log.message.decode_columns, and what iter_messages raises at the message where
    it stopped, if one failed its checks."""
    columns = _decode_columns(buf, base_offset, end_offset)
    return columns, None if columns.bad is None else decode_failure(buf, columns.bad)
