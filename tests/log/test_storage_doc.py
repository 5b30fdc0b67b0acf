"""docs/storage.md stays true: its worked examples are what the code encodes and decodes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from broker.log.message import encode_message, iter_messages

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
