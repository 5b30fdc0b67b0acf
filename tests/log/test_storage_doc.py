"""docs/storage.md stays true: its worked examples are what the code encodes and decodes."""

from __future__ import annotations

import ast
import contextlib
import os
import re
from pathlib import Path

import pytest
import zstandard
from xxhash import xxh3_64_intdigest

from broker.log import codec, hwcheckpoint
from broker.log.files import OPEN_FILES
from broker.log.message import encode_message, iter_messages
from tests.log.test_compression import as_inner

DOC = Path(__file__).parents[2] / "docs" / "storage.md"
EXAMPLE = re.compile(r"<!-- example: (?P<call>.+?) -->\n```\n(?P<dump>.*?)```", re.DOTALL)


def documented_examples() -> list[tuple[str, bytes]]:
    examples = []
    for match in EXAMPLE.finditer(DOC.read_text()):
        lines = match.group("dump").splitlines()
        data = bytes.fromhex("".join(line.split(maxsplit=1)[1] for line in lines))
        examples.append((match.group("call"), data))
    return examples


def call_encode_message(call: str) -> bytes:
    """Evaluate a documented `encode_message(...)` call whose arguments are literals."""
    node = ast.parse(call, mode="eval").body
    assert isinstance(node, ast.Call)
    assert isinstance(node.func, ast.Name) and node.func.id == "encode_message"
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    return encode_message(*args, **kwargs)


def test_the_document_has_its_worked_examples() -> None:
    assert len(documented_examples()) == 2


@pytest.mark.parametrize(("call", "dump"), documented_examples())
def test_documented_hex_dump_is_what_encode_message_produces(call: str, dump: bytes) -> None:
    assert call_encode_message(call) == dump


def test_documented_offsets_of_the_two_message_set() -> None:
    (_, first), (_, second) = documented_examples()
    offsets = [m.offset for m in iter_messages(first + second)]
    assert offsets == [0, 38]
    assert len(first + second) == 69


def test_the_documented_high_watermark_checkpoint_is_what_the_code_writes(tmp_path: Path) -> None:
    marker = "<!-- high-watermark-checkpoint example -->\n```\n"
    block = DOC.read_text().split(marker, 1)[1].split("```", 1)[0]
    documented = bytes.fromhex(block)
    assert hwcheckpoint.encode(6922) == documented
    assert hwcheckpoint.decode(documented) == 6922
    checkpoint = hwcheckpoint.HighWatermarkCheckpoint(tmp_path)
    assert (checkpoint.value, checkpoint.problem) == (0, None)  # missing: 0
    checkpoint.write(6922)
    assert (tmp_path / "high-watermark-checkpoint").read_bytes() == documented
    assert hwcheckpoint.HighWatermarkCheckpoint(tmp_path).value == 6922


def test_a_checkpoint_keeps_its_handle_between_writes_within_max_open_files(
    tmp_path: Path,
) -> None:
    """One open(2) for many writes, the handle counted in OPEN_FILES: released when more than
    its limit are open (the next write opens the file again), and by close()."""

    def handles() -> int:
        path, targets = str(tmp_path / "high-watermark-checkpoint"), []
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(FileNotFoundError):  # the listing's own descriptor
                targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        return targets.count(path)

    checkpoint = hwcheckpoint.HighWatermarkCheckpoint(tmp_path)
    before = len(OPEN_FILES)
    for high_watermark in range(1, 50):
        checkpoint.write(high_watermark)
    assert handles() == 1 and len(OPEN_FILES) == before + 1
    limit, newer = OPEN_FILES.limit, object()
    try:
        OPEN_FILES.limit = 1
        OPEN_FILES.used(newer, lambda: None)  # a newer handle: the checkpoint's goes
        assert handles() == 0
        checkpoint.write(50)
        assert handles() == 1
    finally:
        OPEN_FILES.closed(newer)
        OPEN_FILES.limit = limit
    checkpoint.close()
    assert handles() == 0
    assert hwcheckpoint.HighWatermarkCheckpoint(tmp_path).value == 50


def test_a_torn_or_foreign_high_watermark_checkpoint_reads_as_0_and_says_why(
    tmp_path: Path,
) -> None:
    path = tmp_path / "high-watermark-checkpoint"
    good = hwcheckpoint.encode(1 << 40)
    foreign = b"XXXX" + good[4:16]
    for damaged, why in [
        (good[:-1] + bytes([good[-1] ^ 1]), "checksum does not match"),
        (good[:12], "12 bytes, not 24"),
        (foreign + xxh3_64_intdigest(foreign).to_bytes(8, "big"), "not a format this broker"),
    ]:
        path.write_bytes(damaged)
        checkpoint = hwcheckpoint.HighWatermarkCheckpoint(tmp_path)
        assert checkpoint.value == 0
        assert checkpoint.problem is not None and why in checkpoint.problem


COMPRESSED = re.compile(
    r"<!-- (?P<what>inner set|compressed set): .+? -->\n```\n(?P<dump>.*?)```", re.DOTALL
)


def test_the_documented_compressed_set_reads_as_the_two_messages() -> None:
    """The inner set and compressed set of docs/storage.md: the two worked examples with
    checksum fields 0, and a valid set whose zstd frame holds them, read at offset 0 with
    sizes 0 and the set's."""
    dumps = {}
    for match in COMPRESSED.finditer(DOC.read_text()):
        lines = match.group("dump").splitlines()
        dumps[match.group("what")] = bytes.fromhex(
            "".join(line.split(maxsplit=1)[1] for line in lines)
        )
    inner, data = dumps["inner set"], dumps["compressed set"]
    (_, first), (_, second) = documented_examples()
    assert inner == as_inner(first + second)
    assert len(data) == 92
    result = codec.scan(data, 1 << 20)
    assert (result.error, result.first_new, codec.check_sets(data, result)) == (None, 0, 2)
    assert zstandard.decompress(data[26:]) == inner
    messages, failure = codec.decode(data, 0)
    assert failure is None
    assert [(m.value, m.offset, m.size) for m in messages] == [(b"hello", 0, 0), (b"world", 0, 92)]
    assert messages[0].key == b"user-42"


HEADERS = re.compile(r"<!-- headers: (?P<call>.+?) -->\n```\n(?P<dump>.*?)```", re.DOTALL)


def test_the_documented_message_with_headers_is_what_encode_message_makes() -> None:
    (match,) = HEADERS.finditer(DOC.read_text())
    lines = match.group("dump").splitlines()
    dump = bytes.fromhex("".join(line.split(maxsplit=1)[1] for line in lines))
    node = ast.parse(match.group("call"), mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    assert node.func.id == "encode_message"
    assert encode_message(*[ast.literal_eval(a) for a in node.args]) == dump
    (decoded,) = codec.decode(dump, 0)[0]
    assert (decoded.key, decoded.value) == (b"user-42", b"hello")
    assert decoded.headers == (("trace-id", b"4bf92f35"), ("gone", None))
