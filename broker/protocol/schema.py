"""The language of the api tables (broker.protocol.tables), and the codec they drive.

A body is a `Body`: the value class it is read into and written from, and its fields in wire
order. A field is a `Field` (an integer type, "string", "bytes", "flag" or "code"), or a
`Many`: a count field, then that many items, each one field or a body of its own. Each has the
versions that carry it, [since, until]. The names are the wire's, as docs/protocol.md spells
them (a test reads its tables against these); `attr` names the value's attribute when it
differs.

Bodies are compiled once per version (`Body.at`, a Layout) into an encoder and a reader,
written as Python source from the fields and compiled: consecutive fixed-size fields are one
struct, then strings and arrays in order. Encoding reads each field from the value's
attribute; a field the version lacks must hold its default in a request (a ValueError names
it; a reply leaves it out unless the field is `strict`). Decoding reads the fields with a
Reader (whose errors name the field and its byte), then calls the body's `make` with the
values by attribute: it checks what the layout cannot (ranges, order) and builds the value;
a body without one is built straight from its fields, and its `check` checks the value.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, Final

from broker.log.message import Buffer
from broker.protocol.codes import known_code
from broker.protocol.wire import INT_CODES, Fields, Reader, encode_bytes_length, encode_string

WIRE_TYPES: Final = {"flag": "u8", "code": "i16"}
"""Types read as integers of another type: a flag is a u8 of 0 or 1 (a bool), a code an i16
error code (an ErrorCode when known)."""
LAST: Final = 0xFFFF
"""The highest version there can be: a field's `until` while it is current."""

Make = Callable[[Reader, dict[str, Any], int], Any]
"""A body's maker: checks the values read (by attribute), raising reader.fail(...), and builds
the value; given the reader, the values and the version."""
Check = Callable[[Reader, Any, int], None]
"""A body's check of a value built straight from its fields, raising reader.fail(...); given
the reader, the value and the version."""


@dataclasses.dataclass(frozen=True, slots=True)
class Field:
    """One field: its wire `name`, `type`, the versions that have it, the value's attribute
    (`attr`, default the name); `strict`: an older reply refuses a value of it other than its
    default (else the field is left out)."""

    name: str
    type: str
    since: int = 1
    until: int = LAST
    attr: str = ""
    strict: bool = False

    @property
    def key(self) -> str:
        return self.attr or self.name

    @property
    def wire_type(self) -> str:
        """Its type as the docs' tables give it (a flag is a u8, a code an i16)."""
        return WIRE_TYPES.get(self.type, self.type)

    @property
    def code(self) -> str | None:
        """Its struct code, None for a string or bytes."""
        return INT_CODES.get(self.wire_type)

    def has(self, version: int) -> bool:
        return self.since <= version <= self.until


@dataclasses.dataclass(frozen=True, slots=True)
class Many:
    """A count (`count`, a Field of an integer type) then that many items: of one field (the
    value is a tuple of them), or of a Body (a tuple of its values); `pairs`: the items are a
    body of two strings, read into (key, value) tuples and written from a mapping's items."""

    attr: str
    count: Field
    item: Field | Body
    since: int = 1
    until: int = LAST
    pairs: bool = False
    strict: bool = False

    @property
    def key(self) -> str:
        return self.attr

    def has(self, version: int) -> bool:
        return self.since <= version <= self.until


@dataclasses.dataclass(frozen=True, slots=True)
class Body:
    """A body of api `api` (its name, for errors): the value class `cls` and its `fields` in
    wire order. `make` checks the values read and builds the value; without one, the value is
    built straight from the fields (faster) and `check`, if any, checks it. `prepare` gives
    the value to write at a version (default: the value as it is); `strict`: any field the
    version lacks must hold its default (requests). `rest`: the attribute that is the rest of
    the frame after the fields (PRODUCE's message set); `frame`: the attribute that is a frame
    of its own after this one (FETCH's)."""

    api: str
    cls: type
    fields: tuple[Field | Many, ...]
    make: Make | None = None
    check: Check | None = None
    prepare: Callable[[Any, int], Any] | None = None
    strict: bool = False
    rest: str = ""
    frame: str = ""
    layouts: dict[int, Layout] = dataclasses.field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """The body compiled, by version, as `at` compiles it."""

    def at(self, version: int) -> Layout:
        """This body compiled for `version` (once)."""
        layout = self.layouts.get(version)
        if layout is None:
            layout = self.layouts[version] = Layout(self, version)
        return layout

    def run(self, *names: str) -> Fields:
        """The fixed-size fields `names`, consecutive in this body, as one struct: for reading
        them straight from a frame (the hot path's peeks)."""
        fields = [f for f in self.fields if isinstance(f, Field) and f.name in names]
        if [f.name for f in fields] != list(names) or any(f.code is None for f in fields):
            raise ValueError(f"{names} are not fixed-size fields of {self.cls.__name__}")
        first = self.fields.index(fields[0])
        if self.fields[first : first + len(fields)] != tuple(fields):
            raise ValueError(f"{names} do not follow each other in {self.cls.__name__}")
        return _run(fields)

    def rows(self, version: int) -> Iterator[tuple[str, str]]:
        """Its fields at `version`, (name, type) in wire order, the items of an array after
        its count: as the docs' tables list them."""
        for field in self.fields:
            if not field.has(version):
                continue
            if isinstance(field, Field):
                yield field.name, field.wire_type
                continue
            yield field.count.name, field.count.wire_type
            if isinstance(field.item, Field):
                yield field.item.name, field.item.wire_type
            else:
                yield from field.item.rows(version)


def _defaults(cls: type) -> dict[str, Any]:
    """The default of each field of dataclass or NamedTuple `cls` that has one."""
    if dataclasses.is_dataclass(cls):
        defaults: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                defaults[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                defaults[f.name] = f.default_factory()
        return defaults
    return dict(getattr(cls, "_field_defaults", {}))


def _convert(reader: Reader, field: Field, number: int) -> Any:
    """A flag's bool (MalformedReply/Request above 1), a code's ErrorCode when known."""
    if field.type == "flag":
        if number > 1:
            raise reader.fail(f"field {field.name} is {number}: it must be 0 or 1")
        return bool(number)
    return known_code(number)


@dataclasses.dataclass(frozen=True, slots=True)
class Pair:
    """A setting's key and value, as a settings array's item is written from (Many.pairs)."""

    key: str
    value: str


class Layout:
    """A body compiled for one version: an encoder and a reader generated from its fields
    (Python source, compiled once: as fast as one written by hand, as Kafka generates its
    message classes from its JSON schemas), and the fields it lacks that encoding checks."""

    __slots__ = ("body", "build", "decode_from", "encode_into", "lacks", "read", "version")

    def __init__(self, body: Body, version: int) -> None:
        self.body = body
        self.version = version
        defaults = _defaults(body.cls)
        self.lacks = tuple(
            (field, defaults.get(field.key))
            for field in body.fields
            if not field.has(version) and (body.strict or field.strict)
        )
        present = [field for field in body.fields if field.has(version)]
        source = _Source(version)
        self.encode_into: Callable[[list[Buffer], Any], None] = source.encoder(self, present)
        """Append a value's fields at this version to a list of parts. ValueError for a field
        the version lacks that holds other than its default (see Body), or a value its type
        cannot carry (Fields.pack, encode_string)."""
        self.read: Callable[[Reader], dict[str, Any]] = source.reader(present)
        """The values of the fields at this version, read from a Reader, by attribute (and
        the rest of the frame, for a body with `rest`): what `make` takes."""
        self.build: Callable[..., Any] = source.reader(present, body)
        """The value of a body without `make`, built straight from the fields read from a
        Reader (and the rest of the frame, for a body with `rest`; the frame after this one,
        given, for one with `frame`), unchecked."""
        self.decode_from: Callable[[Reader], Any] = (
            self._made
            if body.make is not None
            else self.build
            if body.check is None
            else self._checked
        )
        """The value read from a Reader at this version, made by `make`, or built and checked
        (an item of an array)."""

    def refuse(self, value: Any) -> None:
        """ValueError naming the first field this version lacks that `value` sets."""
        for field, default in self.lacks:
            if getattr(value, field.key) != default:
                send = field.since if self.version < field.since else field.until
                raise ValueError(
                    f"field {field.key} is {getattr(value, field.key)!r}: {self.body.api} "
                    f"version {self.version} has no such field (send version {send})"
                )

    def make(self, reader: Reader, values: dict[str, Any]) -> Any:
        """The value `make` builds from `values` (read by `read`), checked."""
        assert self.body.make is not None
        return self.body.make(reader, values, self.version)

    def check(self, reader: Reader, value: Any) -> None:
        """Check a value that `build` built (the body's `check`)."""
        if self.body.check is not None:
            self.body.check(reader, value, self.version)

    def _made(self, reader: Reader) -> Any:
        return self.make(reader, self.read(reader))

    def _checked(self, reader: Reader) -> Any:
        value = self.build(reader)
        self.check(reader, value)
        return value


class _Source:
    """Writes the functions of a Layout as Python source; `names` holds what they use."""

    def __init__(self, version: int) -> None:
        self.version = version
        self.names: dict[str, Any] = {
            "encode_string": encode_string,
            "encode_bytes_length": encode_bytes_length,
            "convert": _convert,
        }

    def name(self, thing: Any) -> str:
        """A name for `thing` in the generated code's namespace."""
        name = f"n{len(self.names)}"
        self.names[name] = thing
        return name

    def compile(self, source: list[str], function: str) -> Any:
        namespace = dict(self.names)
        exec("\n".join(source), namespace)
        return namespace[function]

    def encoder(self, layout: Layout, fields: list[Field | Many]) -> Any:
        lines = ["def encode(parts, value):", "    append = parts.append"]
        refuse = self.name(layout.refuse)
        for field, default in layout.lacks:
            lines.append(f"    if value.{field.key} != {self.name(default)}: {refuse}(value)")
        if layout.body.prepare is not None:
            lines.append(f"    value = {self.name(layout.body.prepare)}(value, {self.version})")
        for group in _groups(fields):
            if isinstance(group, list):
                pack = self.name(_run(group).pack)
                lines.append(f"    append({pack}({', '.join(f'value.{f.key}' for f in group)}))")
            elif isinstance(group, Field) and group.type == "bytes":
                lines += [
                    f"    append(encode_bytes_length({group.name!r}, value.{group.key}))",
                    f"    append(value.{group.key})",
                ]
            elif isinstance(group, Field):
                lines.append(f"    append(encode_string({group.name!r}, value.{group.key}))")
            else:
                lines += self.many_encoder(group)
        return self.compile(lines, "encode")

    def many_encoder(self, many: Many) -> list[str]:
        count = self.name(_run([many.count]).pack)
        lines = [f"    items = value.{many.attr}", f"    append({count}(len(items)))"]
        item = many.item
        if many.pairs:
            assert isinstance(item, Body)
            key, text = (f.key for f in item.fields)
            lines += [
                "    for key, text in items.items():",
                f"        append(encode_string({key!r}, key))",
                f"        append(encode_string({text!r}, text))",
            ]
        elif isinstance(item, Body):
            encode = self.name(item.at(self.version).encode_into)
            lines += ["    for item in items:", f"        {encode}(parts, item)"]
        elif item.code is not None:
            pack = self.name(_run([item]).pack)
            lines.append(f"    parts += [{pack}(item) for item in items]")
        else:
            lines.append(f"    parts += [encode_string({item.name!r}, item) for item in items]")
        return lines

    def reader(self, fields: list[Field | Many], body: Body | None = None) -> Any:
        """A function of a Reader that reads `fields` (and the rest of the frame when they are
        a body's with `rest`): into a dict by attribute, or, given their `body`, into its class
        built by keyword (its `frame` given as the function's second argument)."""
        lines = [
            "def read(reader, frame=None):",
            "    fixed = reader.fixed",
            "    string = reader.string",
        ]
        keys: list[str] = []
        for group in _groups(fields):
            if isinstance(group, list):
                targets = "".join(f"v_{f.key}, " for f in group)
                lines.append(f"    {targets}= fixed({self.name(_run(group))})")
                for field in group:
                    if field.type in WIRE_TYPES:
                        lines.append(
                            f"    v_{field.key} = convert(reader, {self.name(field)}, "
                            f"v_{field.key})"
                        )
                keys += [f.key for f in group]
            elif isinstance(group, Field):
                read = "reader.bytes" if group.type == "bytes" else "string"
                lines.append(f"    v_{group.key} = {read}({group.name!r})")
                keys.append(group.key)
            else:
                lines += self.many_reader(group)
                keys.append(group.attr)
        if body is None:
            lines.append("    return {" + ", ".join(f"{k!r}: v_{k}" for k in keys) + "}")
            return self.compile(lines, "read")
        if body.rest:
            lines.append(f"    v_{body.rest} = reader.rest()")
            keys.append(body.rest)
        if body.frame:
            lines.append(f"    v_{body.frame} = frame")
            keys.append(body.frame)
        lines.append(f"    return {self.name(body.cls)}({_arguments(body.cls, keys)})")
        return self.compile(lines, "read")

    def many_reader(self, many: Many) -> list[str]:
        lines = [f"    (count,) = fixed({self.name(_run([many.count]))})"]
        item, target = many.item, f"v_{many.attr}"
        if many.pairs:  # settings: each string named with its index, as key[2]
            assert isinstance(item, Body)
            key, text = (f.key for f in item.fields)
            each = f'(string(f"{key}[{{i}}]"), string(f"{text}[{{i}}]"))'
            lines.append(f"    {target} = tuple([{each} for i in range(count)])")
        elif isinstance(item, Body):
            decode = self.name(item.at(self.version).decode_from)
            lines.append(f"    {target} = tuple([{decode}(reader) for _ in range(count)])")
        elif item.code is not None:
            run = self.name(_run([item]))
            lines.append(f"    {target} = tuple([fixed({run})[0] for _ in range(count)])")
        else:
            each = f'string(f"{item.name}[{{i}}]")'
            lines.append(f"    {target} = tuple([{each} for i in range(count)])")
        return lines


def _arguments(cls: type, keys: list[str]) -> str:
    """The arguments that build `cls` from the variables v_<key> of `keys`: by position while
    the class's fields come in its order (faster), then by keyword."""
    order = (
        [f.name for f in dataclasses.fields(cls) if f.init]
        if dataclasses.is_dataclass(cls)
        else list(getattr(cls, "_fields", ()))
    )
    given = set(keys)
    arguments: list[str] = []
    for name in order:
        if name not in given:
            break
        arguments.append(f"v_{name}")
        given.discard(name)
    arguments += [f"{key}=v_{key}" for key in keys if key in given]
    return ", ".join(arguments)


def _groups(fields: list[Field | Many]) -> Iterator[list[Field] | Field | Many]:
    """`fields` with the fixed-size ones that follow each other gathered into lists (runs)."""
    run: list[Field] = []
    for field in fields:
        if isinstance(field, Field) and field.code is not None:
            run.append(field)
            continue
        if run:
            yield run
            run = []
        yield field
    if run:
        yield run


def _run(fields: list[Field]) -> Fields:
    return Fields(*((f.name, f.code or "") for f in fields))
