"""docs/protocol.md's field tables and error lists against the api tables the code runs on
(broker.protocol.tables): a field renamed, retyped, moved, added or dropped on either side
fails here, as a changed byte fails the vectors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.protocol import TABLES, Api, ApiTable, ErrorCode
from broker.protocol.wire import INT_CODES

DOC = (Path(__file__).parents[2] / "docs" / "protocol.md").read_text()
SECTION = re.compile(r"^### ([A-Z_]+) \(api_key (\d+)\)\n(.*?)(?=^###? )", re.DOTALL | re.MULTILINE)
TYPES = "|".join([*INT_CODES, "string", "bytes"])
ROW = re.compile(rf"^\|(?:[^|\n]*\|){{1,2}} *`({TYPES})` *\| *`(\w+)` *\|", re.MULTILINE)

Rows = list[tuple[str, str]]


def sections() -> dict[str, tuple[int, str]]:
    """Each api's section of docs/protocol.md ("### NAME (api_key N)"): its key and text."""
    apis = DOC[DOC.index("\n## Apis\n") : DOC.index("\n## Messages and offsets\n")] + "\n## "
    return {name: (int(key), text) for name, key, text in SECTION.findall(apis)}


def doc_tables(text: str) -> list[Rows]:
    """The field tables of a section: each table's (field, type) rows in order (a table of
    fields has the columns size, type, field, meaning, and an offset column first or not)."""
    tables: list[Rows] = []
    for block in re.findall(r"(?:^\|.*\n)+", text, re.MULTILINE):
        rows = [(field, kind) for kind, field in ROW.findall(block)]
        if rows:
            tables.append(rows)
    return tables


def code_layouts(table: ApiTable) -> list[Rows]:
    """The request's and the reply's rows at each version of the api."""
    return [
        list(body.rows(version))
        for body in (table.request, table.reply)
        for version in table.versions
    ]


def runs_in(rows: Rows, layout: Rows) -> bool:
    return any(layout[i : i + len(rows)] == rows for i in range(len(layout) - len(rows) + 1))


def test_every_api_has_its_section_under_its_key() -> None:
    assert {name: key for name, (key, _) in sections().items()} == {
        api.name: api.value for api in Api
    }
    assert set(TABLES) == set(Api)


@pytest.mark.parametrize("api", list(Api), ids=lambda api: api.name)
def test_the_documents_field_tables_are_the_codes(api: Api) -> None:
    table = TABLES[api]
    _, text = sections()[api.name]
    documented = doc_tables(text)
    layouts = code_layouts(table)
    for rows in documented:  # each table of the document: the fields of a version, in order
        assert any(runs_in(rows, layout) for layout in layouts), (
            f"{api.name}: the document's table {rows} is in no version of the code's "
            f"request or reply: {layouts}"
        )
    # and every field of the code is in a table of the document
    assert {row for rows in documented for row in rows} == {
        row for layout in layouts for row in layout
    }


@pytest.mark.parametrize("api", list(Api), ids=lambda api: api.name)
def test_the_documents_errors_of_each_api_are_the_tables(api: Api) -> None:
    _, text = sections()[api.name]
    said = re.search(r"Errors:(.*?)(?:\n\n|$)", text, re.DOTALL)
    codes = set() if said is None else set(re.findall(r"`([A-Z_]+)`", said.group(1)))
    assert codes == {code.name for code in TABLES[api].errors}
    assert codes <= {code.name for code in ErrorCode}


@pytest.mark.parametrize("api", list(Api), ids=lambda api: api.name)
def test_each_version_of_an_api_is_in_its_section(api: Api) -> None:
    _, text = sections()[api.name]
    for version in TABLES[api].versions[1:]:
        assert re.search(rf"\b[Vv]ersion {version}\b", text), f"{api.name} version {version}"
