# The C functions of broker/log/_codec.c; broker.log.message and broker.log.columns have their
# Python references.
from broker.log.columns import Columns, Piece
from broker.log.headers import HeaderItems
from broker.log.message import Buffer, Message, R, Walked

def scan_walk(
    buf: Buffer, max_message_bytes: int, index_interval: int, next_mark: int, inner: bool
) -> Walked: ...
def decode_set(
    buf: Buffer, base_offset: int, start: int, set_size: int
) -> tuple[list[Message], int | None]: ...
def decode_records(
    buf: Buffer,
    base_offset: int,
    start: int,
    set_size: int,
    record_type: type[R],
    topic: str,
    partition: int,
) -> tuple[list[R], int | None]: ...
def decode_columns(pieces: list[Piece], end_offset: int) -> Columns: ...
def encode_message(
    value: bytes,
    key: bytes | None = None,
    timestamp_ms: int | None = None,
    inner: bool = False,
    headers: HeaderItems | None = None,
) -> bytes: ...
