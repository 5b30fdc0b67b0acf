"""The wire protocol: docs/protocol.md's test vectors against the code, round trips, every way a
request or reply can be malformed, routing peeks, and the error table."""

from __future__ import annotations

import inspect
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any, cast

import pytest
import zmq
from hypothesis import given
from hypothesis import strategies as st

from broker import errors, protocol
from broker.config import REPLICA_SETTINGS, TOPIC_SETTINGS
from broker.errors import (
    BrokerError,
    BrokerShuttingDown,
    CoordinatorLoading,
    CorruptSegment,
    DiskFull,
    FencedLeaderEpoch,
    FencedMemberEpoch,
    FetchSizeTooSmall,
    GroupHasZooKeeperMembers,
    GroupNotEmptyError,
    InvalidGroup,
    InvalidMessage,
    InvalidOffset,
    InvalidTopic,
    MalformedReply,
    MalformedRequest,
    MessageTooLarge,
    NotCoordinator,
    NotEnoughReplicas,
    NotLeaderForPartition,
    OffsetOutOfRange,
    PartitionNotAssigned,
    PartitionUnavailable,
    PylogError,
    RegistryUnavailable,
    StorageError,
    StorageIOError,
    TopicAlreadyExists,
    Unavailable,
    UnknownGroup,
    UnknownLeaderEpoch,
    UnknownMemberId,
    UnknownTopicOrPartition,
    UnreleasedInstanceId,
    UnsupportedApi,
    UnsupportedVersion,
)
from broker.log.config import BOUNDS, CHOICES, LogConfig
from broker.log.message import Buffer, encode_message, iter_messages
from broker.log.producers import StoredSet
from broker.protocol import (
    API_VERSIONS,
    ERROR_FIELDS,
    ERROR_TABLE,
    PRODUCE_IDEMPOTENT_VERSION,
    PRODUCERS_FETCH_VERSION,
    Ack,
    AlterConfigRequest,
    Api,
    ClusterBroker,
    CommitPart,
    CommitPartReply,
    CommittedOffset,
    CommittedTopic,
    ConfigEntry,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeClusterReply,
    DescribeClusterRequest,
    DescribeConfigReply,
    DescribeConfigRequest,
    DescribeGroupReply,
    DescribeGroupRequest,
    DescribePartitionReply,
    DescribePartitionRequest,
    EmptyReply,
    EpochEntry,
    ErrorCode,
    FetchPartReply,
    FetchReply,
    FetchRequest,
    GroupHeartbeatReply,
    GroupHeartbeatRequest,
    GroupListing,
    GroupMemberInfo,
    GroupPartitions,
    KnownPrefixes,
    ListGroupsReply,
    ListGroupsRequest,
    MetadataBroker,
    MetadataReply,
    MetadataRequest,
    MultiFetchReply,
    MultiFetchRequest,
    MultiProduceReply,
    MultiProduceRequest,
    OffsetCommitReply,
    OffsetCommitRequest,
    OffsetFetchReply,
    OffsetFetchRequest,
    OffsetForLeaderEpochReply,
    OffsetForLeaderEpochRequest,
    OffsetsReply,
    OffsetsRequest,
    PartitionInfo,
    PartReply,
    ProducePart,
    ProduceReply,
    ProduceRequest,
    Reply,
    ReplyHeader,
    Request,
    RequestHeader,
    Route,
    TopicInfo,
    broker_error,
    check_topic_name,
    decode_reply,
    decode_reply_header,
    decode_request,
    encode_error,
    encode_reply,
    encode_request,
    error_code_for,
    error_entry,
    is_fire_and_forget,
    peek_correlation_id,
)

DOC = Path(__file__).parents[2] / "docs" / "protocol.md"
MESSAGE = encode_message(b"hello", key=b"user-42", timestamp_ms=1_700_000_000_000)
PARTITION_APIS = {Api.PRODUCE, Api.FETCH, Api.OFFSETS}


# -- the document's test vectors ---------------------------------------------------------------


@dataclass(frozen=True)
class Vector:
    """One ```vector block of docs/protocol.md (its format is described there)."""

    name: str
    kind: str
    api: str
    request: str | None
    frames: list[bytes]
    reply_frames: list[bytes]
    value: dict[str, Any]


VECTOR_BLOCK = re.compile(r"^```vector\n(.*?)^```$", re.DOTALL | re.MULTILINE)
FRAME_LINE = re.compile(r"(reply )?frame (\d+):$")
SIZE = re.compile(r"(\d+) bytes?\b")
HEAD_LINES = ("name", "kind", "api", "request")


def check_sizes(name: str, parts: list[tuple[str, str]]) -> None:
    """Each comment that gives a size in bytes (after `frame N:`, or on a line of its own) is
    the size of the hex from it to the next such comment of the frame (or, after `frame N:`,
    of the whole frame)."""
    for i, (comment, hex_) in enumerate(parts):
        sizes = SIZE.findall(comment)
        if not sizes:
            continue
        if comment.startswith("frame"):
            size = sum(len(h) for _, h in parts) // 2
        else:
            size = len(hex_) // 2
            for later, more in parts[i + 1 :]:
                if later.startswith("frame") or SIZE.search(later) or "empty" in later:
                    break
                size += len(more) // 2
        assert int(sizes[-1]) == size, f"{name}: {comment!r} says {sizes[-1]}, holds {size}"


def parse_vector(block: str) -> Vector:
    head: dict[str, str] = {}
    frames: dict[str, list[str]] = {"request": [], "reply": []}
    parts: list[tuple[str, str]] = []
    current: list[str] | None = None
    lines = block.splitlines()
    for i, raw in enumerate(lines):
        if raw.startswith("value:"):
            value = json.loads("\n".join([raw.removeprefix("value:"), *lines[i + 1 :]]))
            break
        line, _, comment = raw.partition("#")
        line = line.rstrip()
        if not line:
            assert current is not None or not comment, f"a comment outside a frame: {raw!r}"
            if current is not None and comment.strip():
                parts.append((comment.strip(), ""))
            continue
        if line.startswith(" "):
            assert current is not None, f"hex outside a frame: {raw!r}"
            current[-1] += "".join(line.split())
            parts[-1] = (parts[-1][0], parts[-1][1] + "".join(line.split()))
            continue
        frame = FRAME_LINE.fullmatch(line)
        if frame:
            assert {"name", "kind", "api"} <= set(head), f"{lines[0]!r}: name, kind, api first"
            check_sizes(head["name"], parts)
            side = frames["reply" if frame.group(1) else "request"]
            assert int(frame.group(2)) == len(side) + 1, f"frames out of order at {raw!r}"
            side.append("")
            current = side
            parts = [("frame " + comment.strip(), "")]
            continue
        key, _, text = line.partition(":")
        assert key == HEAD_LINES[len(head)], f"{key!r} out of place in {lines[0]!r}"
        head[key] = text.strip()
        if key == "api" and head["kind"] not in ("reply", "error reply"):
            head["request"] = ""  # only replies name a request: skip that line's place
    else:
        raise AssertionError(f"vector without a value: {block[:40]!r}")
    check_sizes(head["name"], parts)
    return Vector(
        name=head["name"],
        kind=head["kind"],
        api=head["api"],
        request=head.get("request") or None,
        frames=[bytes.fromhex(h) for h in frames["request"]],
        reply_frames=[bytes.fromhex(h) for h in frames["reply"]],
        value=value,
    )


def documented_vectors() -> list[Vector]:
    return [parse_vector(block) for block in VECTOR_BLOCK.findall(DOC.read_text())]


def vectors_of(kind: str) -> list[Any]:
    return [pytest.param(v, id=v.name) for v in documented_vectors() if v.kind == kind]


def documented_section(title: str) -> str:
    """The text under the heading `title`, up to the next heading."""
    text = DOC.read_text()
    match = re.search(rf"^#+ {re.escape(title)}\n", text, re.MULTILINE)
    assert match, f"no section {title!r} in {DOC}"
    end = re.compile(r"^#+ ", re.MULTILINE).search(text, match.end())
    return text[match.end() : end.start() if end else len(text)]


def table_rows(section: str) -> list[list[str]]:
    """The body rows of the markdown tables in a section, cells stripped of spaces and `."""
    rows = []
    for line in section.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return [row for row in rows if row[0] not in ("code", "api_key", "key")]


def field_names(section: str) -> set[str]:
    """The names in the `field` column of every table of a section."""
    names: set[str] = set()
    column = None
    for line in section.splitlines():
        if not line.startswith("|"):
            column = None
            continue
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        if column is None:
            column = cells.index("field") if "field" in cells else -1
        elif column >= 0 and not set(line) <= set("|-: "):
            names.add(cells[column])
    return names


RENAMED = {"topics": "topic", "brokers": "broker", "partitions": "partition"}
RENAMED |= {"log_dirs": "log_dir", "entries": "config", "epochs": "epoch", "replicas": "replica"}
RENAMED |= {"producers": "producer", "parts": "part"}
RENAMED |= {"members": "member", "groups": "group", "offsets": "partition"}
"""Python names of repeated groups -> the document's (its count field without _count). A
partition list (owned, assignment, assigned, ...) keeps its own name, which the document's
tables give it."""

FIELD_VERSIONS: dict[type, dict[str, int]] = {
    FetchRequest: dict.fromkeys(("replica_id", "leader_epoch", "flushed_offset"), 2),
    FetchReply: {"leader_epoch": 2, "epochs": 2, "throttle_ms": 4, "producers": 5},
    ProduceRequest: dict.fromkeys(("producer_id", "producer_epoch", "sequence"), 3),
    ProduceReply: {"throttle_ms": 2},
    MetadataBroker: {"rack": 2},
    PartitionInfo: dict.fromkeys(("leader_epoch", "replicas", "isr"), 2),
    DescribePartitionReply: dict.fromkeys(
        ("retention_check_interval_ms", "append_bytes_per_s", "segment_list"), 2
    ),
    MultiFetchRequest: dict.fromkeys(("session_id", "session_epoch", "forgotten"), 2),
    MultiFetchReply: {"session_id": 2},
}
"""The fields of each class that only a later version carries, and the first version that
does: a vector of an older version does not show them."""
RENAMED_AT_VERSION_2: dict[type, dict[str, str]] = {PartitionInfo: {"broker_id": "leader"}}
"""Python names -> the document's, at version 2 only."""


def plain(value: object, version: int = 1) -> Any:
    """A decoded value as the JSON of a vector of api_version `version` shows it: enums by
    name, message sets as their messages (key and value as text), records as objects, with the
    document's names, and only the fields of that version."""
    if isinstance(value, Enum):
        return value.name
    if isinstance(value, PartReply):  # its reply as hex (the document's vectors say so)
        return {
            "topic": value.topic,
            "partition": value.partition,
            "reply": bytes(value.reply).hex(),
        }
    if isinstance(value, FetchPartReply):  # a MULTI_FETCH part: its reply as hex, as above
        return {
            "topic": value.topic,
            "partition": value.partition,
            "reply": bytes(value.reply).hex(),
            "message_set": plain(value.message_set, version),
        }
    if isinstance(value, bytes | bytearray | memoryview):
        return [
            {
                "timestamp": m.timestamp_ms,
                "key": None if m.key is None else m.key.decode(),
                "value": m.value.decode(),
            }
            for m in iter_messages(value)
        ]
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        since = FIELD_VERSIONS.get(type(value), {})
        left_out = {name for name, first in since.items() if version < first}
        renamed = RENAMED_AT_VERSION_2.get(type(value), {}) if version >= 2 else {}
        for f in fields(value):
            if f.name in left_out:
                continue
            item = getattr(value, f.name)
            name = RENAMED.get(f.name, f.name) if isinstance(item, tuple) else f.name
            out[renamed.get(name, name)] = plain(item, version)
        return out
    if isinstance(value, tuple) and hasattr(value, "_asdict"):  # a NamedTuple: EpochEntry
        return {name: plain(item, version) for name, item in value._asdict().items()}
    if isinstance(value, tuple | list):
        return [plain(item, version) for item in value]
    if isinstance(value, Mapping):
        return {key: plain(item, version) for key, item in value.items()}
    return value


def request_header_value(header: RequestHeader) -> dict[str, Any]:
    return {
        "api_key": header.api.name,
        "api_version": header.version,
        "correlation_id": header.correlation_id,
        "client_id": header.client_id,
    }


def reply_header_value(frames: list[bytes]) -> dict[str, Any]:
    header = decode_reply_header(frames)
    code = header.error_code
    return {
        "correlation_id": header.correlation_id,
        "error_code": code.name if isinstance(code, ErrorCode) else code,
        "error_message": header.error_message,
    }


def as_bytes(frames: list[Buffer]) -> list[bytes]:
    return [bytes(frame) for frame in frames]


def test_the_document_has_a_request_and_a_reply_vector_for_every_api() -> None:
    vectors = documented_vectors()
    requested = {v.api for v in vectors if v.kind == "request"}
    answered = {v.api for v in vectors if v.kind == "reply"}
    assert requested == answered == {api.name for api in Api}
    assert {v.kind for v in vectors} == {"request", "reply", "error reply", "rejected request"}
    assert len({v.name for v in vectors}) == len(vectors)


def test_every_reply_names_its_request_of_the_same_api_and_correlation_id() -> None:
    by_name = {v.name: v for v in documented_vectors()}
    for vector in by_name.values():
        if vector.kind in ("request", "rejected request"):
            assert vector.request is None, vector.name
            header = vector.value.get("header") or {}
            assert vector.api == header.get("api_key", vector.api), vector.name
            continue
        assert vector.request in by_name, f"{vector.name}: no request {vector.request!r}"
        request = by_name[vector.request]
        assert request.kind == "request", vector.name
        assert vector.api == request.api, vector.name
        assert (
            vector.value["header"]["correlation_id"]
            == request.value["header"]["correlation_id"]
            == peek_correlation_id(request.frames)
        ), vector.name


def test_every_json_name_of_a_vector_is_a_field_of_the_document_tables() -> None:
    common = field_names(documented_section("Request header"))
    common |= field_names(documented_section("Reply header"))
    common |= field_names(documented_section("Error fields"))
    message = field_names(documented_section("Messages and offsets"))
    sections = {
        api: field_names(documented_section(f"{api.name} (api_key {api.value})")) for api in Api
    }

    def check(value: Any, names: set[str], where: str) -> None:
        if isinstance(value, list):
            for item in value:
                check(item, names, where)
            return
        if not isinstance(value, dict):
            return
        for key, item in value.items():
            if key == "message_set":
                for record in item:
                    assert set(record) <= message, f"{where}: {sorted(record)} not all fields"
            elif key in names:
                check(item, names, f"{where}.{key}")
            elif f"{key}_count" in names:
                if isinstance(item, dict):  # key and value pairs: topic settings
                    assert set(item) <= set(TOPIC_SETTINGS), f"{where}.{key}: {sorted(item)}"
                else:
                    check(item, names, f"{where}.{key}")
            else:
                raise AssertionError(f"{where}: {key!r} is no field of the document's tables")

    for vector in documented_vectors():
        names = (
            common | sections.get(Api[vector.api], set())
            if vector.api in Api.__members__
            else common
        )
        value = vector.value.get("reply", vector.value)
        assert set(value) == {"header", "body"}, vector.name
        check(value["header"], names, vector.name)
        check(value["body"], names, vector.name)


@pytest.mark.parametrize("vector", vectors_of("request"))
def test_request_vector_decodes_to_its_values_and_encodes_to_its_bytes(vector: Vector) -> None:
    header, request = decode_request(vector.frames)
    assert request_header_value(header) == vector.value["header"]
    assert plain(request, header.version) == vector.value["body"]
    assert as_bytes(encode_request(header, request)) == vector.frames
    assert peek_correlation_id(vector.frames) == header.correlation_id
    assert is_fire_and_forget(vector.frames) == (vector.value["body"].get("ack") == "NONE")


@pytest.mark.parametrize("vector", vectors_of("reply"))
def test_reply_vector_decodes_to_its_values_and_encodes_to_its_bytes(vector: Vector) -> None:
    version = request_version(vector)
    reply = decode_reply(Api[vector.api], vector.frames, version)
    assert reply_header_value(vector.frames) == vector.value["header"]
    assert plain(reply, version) == vector.value["body"]
    correlation_id = vector.value["header"]["correlation_id"]
    assert as_bytes(encode_reply(correlation_id, reply, version)) == vector.frames


def request_version(reply: Vector) -> int:
    """The api_version of the request vector a reply vector answers: the reply's own."""
    (request,) = [v for v in documented_vectors() if v.name == reply.request]
    version: int = request.value["header"]["api_version"]
    return version


def test_the_vectors_cover_every_version_of_every_api() -> None:
    versions = {
        (v.api, request_version(v) if v.kind == "reply" else v.value["header"]["api_version"])
        for v in documented_vectors()
        if v.kind in ("request", "reply")
    }
    assert {(api.name, v) for api, spoken in API_VERSIONS.items() for v in spoken} <= versions


def test_the_version_2_metadata_vector_is_the_version_1_one_at_version_1() -> None:
    """metadata-reply-v2 is metadata-reply's cluster: at version 1 it encodes to that vector's
    bytes (but for the correlation id), a partition without a leader as its preferred one."""
    by_name = {v.name: v for v in documented_vectors()}
    v1, v2 = by_name["metadata-reply"], by_name["metadata-reply-v2"]
    reply = decode_reply(Api.METADATA, v2.frames, 2)
    (frame,) = encode_reply(v1.value["header"]["correlation_id"], reply, 1)
    assert [bytes(frame)] == v1.frames


@pytest.mark.parametrize("vector", vectors_of("error reply"))
def test_error_reply_vector_raises_its_error_and_encodes_to_its_bytes(vector: Vector) -> None:
    header = vector.value["header"]
    with pytest.raises(BrokerError) as raised:
        decode_reply(Api[vector.api], vector.frames)
    assert reply_header_value(vector.frames) == header
    assert (raised.value.name, raised.value.message) == (
        header["error_code"],
        header["error_message"],
    )
    fields_ = ERROR_FIELDS.get(ErrorCode(raised.value.code))
    names = fields_.names if fields_ else ()
    assert {name: getattr(raised.value, name) for name in names} == vector.value["body"]
    assert as_bytes(encode_error(header["correlation_id"], raised.value)) == vector.frames


@pytest.mark.parametrize("vector", vectors_of("rejected request"))
def test_rejected_request_vector_is_refused_with_its_reply(vector: Vector) -> None:
    with pytest.raises(PylogError) as raised:
        decode_request(vector.frames)
    reply = vector.value["reply"]
    assert reply_header_value(vector.reply_frames) == reply["header"]
    assert error_code_for(raised.value).name == reply["header"]["error_code"]
    assert reply["body"] == {}
    correlation_id = peek_correlation_id(vector.frames)
    assert as_bytes(encode_error(correlation_id, raised.value)) == vector.reply_frames
    with pytest.raises(PylogError):
        KnownPrefixes().route(vector.frames)
    api_key = struct.unpack_from(">H", vector.frames[0])[0]
    assert vector.api == (Api(api_key).name if api_key in set(Api) else str(api_key))


def test_every_vector_has_the_frames_of_its_kind() -> None:
    for v in documented_vectors():
        if v.kind in ("request", "rejected request", "error reply"):
            assert len(v.frames) == 1, v.name
        if v.kind == "reply":
            assert len(v.frames) == (2 if v.api == "FETCH" else 1), v.name
        assert len(v.reply_frames) == (v.kind == "rejected request"), v.name


def test_the_byte_positions_the_document_gives_hold_for_every_request_vector() -> None:
    """The frames table's header range, the body's first byte and PRODUCE's ack rule, read
    from the document and checked against every request vector's bytes."""
    ranges = [row[0] for row in table_rows(documented_section("Frames"))]
    ((first, last),) = [
        map(int, m.groups()) for r in ranges if (m := re.fullmatch(r"(\d+) to (\d+)\+c", r))
    ]
    (body_start,) = [int(m[1]) for r in ranges if (m := re.fullmatch(r"from (\d+)\+c", r))]
    produce = " ".join(documented_section("PRODUCE (api_key 0)").split())
    rule = re.search(
        r"c from bytes (\d+)-(\d+), t from bytes (\d+)\+c and (\d+)\+c; `ack` is byte "
        r"(\d+) \+ c \+ t, so the frame must hold at least (\d+) \+ c \+ t bytes",
        produce,
    )
    assert rule, "PRODUCE's ack rule is not where the test looks for it"
    c_at, c_end, t_at, t_end, ack_at, least = map(int, rule.groups())
    before_set = [int(n) for n in re.findall(r"length minus \((\d+) \+ c \+ t\)", produce)]
    assert len(before_set) == 2, "PRODUCE's message set rules (versions 1 and 3) are not found"
    assert before_set[0] == least  # version 1's set starts right after ack
    for vector in documented_vectors():
        if vector.kind != "request":
            continue
        (frame,) = vector.frames
        header, request = decode_request(vector.frames)
        c = len(header.client_id.encode())
        alone = encode_request(
            RequestHeader(Api.DESCRIBE_CLUSTER, 1, 1, header.client_id), DescribeClusterRequest()
        )
        assert (first, last + c, body_start + c) == (0, len(alone[0]) - 1, len(alone[0])), (
            vector.name
        )
        if isinstance(request, ProduceRequest):
            t = len(request.topic.encode())
            assert struct.unpack(">H", frame[c_at : c_end + 1]) == (c,), vector.name
            assert struct.unpack(">H", frame[t_at + c : t_end + c + 1]) == (t,), vector.name
            assert frame[ack_at + c + t] == request.ack, vector.name
            rest = before_set[header.version >= PRODUCE_IDEMPOTENT_VERSION]
            assert len(frame) - len(request.message_set) == rest + c + t, vector.name


def test_documented_message_sets_are_what_encode_message_builds() -> None:
    by_name = {v.name: v for v in documented_vectors()}
    (produce,) = by_name["produce-request"].frames
    assert produce[17 + 13 :] == MESSAGE  # after a 17-byte header and a 13-byte body
    assert by_name["fetch-reply"].frames[1] == MESSAGE
    assert by_name["fetch-reply"].value["body"]["high_watermark"] == len(MESSAGE)


def test_the_documented_error_table_is_the_error_table() -> None:
    rows = table_rows(documented_section("Error codes"))
    documented = [(int(code), name, retriable) for code, name, retriable, *_ in rows]
    table = [(e.code.value, e.name, "yes" if e.retriable else "no") for e in ERROR_TABLE]
    assert documented == table


def test_the_documented_api_table_is_the_api_enum() -> None:
    rows = table_rows(documented_section("Apis"))
    assert [(int(key), name) for key, name, *_ in rows] == [(a.value, a.name) for a in Api]


def test_the_documented_topic_settings_are_log_config_fields_with_their_defaults() -> None:
    rows = table_rows(documented_section("CREATE_TOPIC (api_key 4)"))
    settings = [row for row in rows if row[1] in ("yes", "no")]
    assert [row[0] for row in settings] == [*TOPIC_SETTINGS, *REPLICA_SETTINGS]
    config_fields = {f.name: f for f in fields(LogConfig)}
    for key, none, default, minimum, maximum, meaning in settings:
        if key in CHOICES:  # words, not numbers: the meaning names every one
            assert (none, minimum, maximum) == ("no", "", "")
            assert default == getattr(LogConfig(), key) and default in CHOICES[key]
            assert meaning.startswith("one of " + ", ".join(f"`{w}`" for w in CHOICES[key]))
            continue
        if key in REPLICA_SETTINGS:  # not a partition log's: least value by default
            assert none == "no" and default == minimum, key
            assert (int(minimum), int(maximum)) == REPLICA_SETTINGS[key], key
            continue
        field = config_fields[key]
        assert ("None" in str(field.type)) == (none == "yes"), key
        assert default == ("none" if field.default is None else str(field.default)), key
        assert (int(minimum), int(maximum)) == BOUNDS[key], key


# -- round trips -------------------------------------------------------------------------------

u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
topics = st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True).filter(
    lambda topic: topic not in (".", "..")
)
texts = st.text(max_size=40)
i32 = st.integers(-(2**31), 2**31 - 1)


@st.composite
def partition_lists(draw: st.DrawFn) -> tuple[GroupPartitions, ...]:
    """A partition list: distinct topics, each with its partitions ascending, no repeats."""
    names = draw(st.lists(topics, max_size=3, unique=True))
    return tuple(GroupPartitions(n, tuple(sorted(draw(st.sets(u32, max_size=4))))) for n in names)


group_requests: st.SearchStrategy[Request] = st.one_of(
    st.builds(
        GroupHeartbeatRequest,
        texts,
        texts,
        st.integers(-2, 2**31 - 1),
        texts,
        u32,
        u32,
        texts,
        st.lists(topics, min_size=1, max_size=3).map(tuple),
        partition_lists(),
    ),
    st.builds(
        OffsetCommitRequest,
        texts,
        texts,
        i32,
        st.lists(
            st.builds(CommitPart, topics, u32, st.integers(0, 2**63 - 1)), min_size=1, max_size=4
        ).map(tuple),
    ),
    st.builds(OffsetFetchRequest, texts, st.lists(topics, max_size=3).map(tuple)),
    st.builds(DescribeGroupRequest, texts),
    st.just(ListGroupsRequest()),
    st.builds(DeleteGroupRequest, texts),
)
"""A request of every consumer group api (their names are the broker's to check)."""

requests: st.SearchStrategy[Request] = st.one_of(
    group_requests,
    st.builds(ProduceRequest, topics, u32, st.sampled_from(Ack), st.binary(max_size=200)),
    st.builds(FetchRequest, topics, u32, u64, st.integers(1, 2**32 - 1), u32, u32),
    st.builds(OffsetsRequest, topics, u32, st.integers(-2, 2**63 - 1)),
    st.builds(MetadataRequest, st.lists(topics, max_size=5).map(tuple)),
    st.builds(
        CreateTopicRequest,
        topics,
        st.integers(1, 2**32 - 1),
        st.dictionaries(texts, texts, max_size=5),
    ),
    st.builds(DeleteTopicRequest, topics),
    st.builds(CreatePartitionsRequest, topics, st.integers(1, 2**32 - 1)),
    st.just(DescribeClusterRequest()),
    st.builds(DescribePartitionRequest, topics, u32),
    st.builds(DescribeConfigRequest, topics),
    st.builds(
        AlterConfigRequest,
        topics,
        st.dictionaries(texts, texts, max_size=5),
        st.lists(texts, max_size=3, unique=True).map(tuple),
    ).filter(lambda request: not set(request.set) & set(request.delete)),
    st.builds(OffsetForLeaderEpochRequest, topics, u32, st.integers(-1, 2**31 - 1)),
    st.one_of(
        st.builds(
            MultiProduceRequest,
            st.sampled_from(Ack),
            st.lists(
                st.builds(ProducePart, topics, u32, st.binary(max_size=60)), min_size=1, max_size=4
            ).map(tuple),
        ),
        st.builds(
            MultiProduceRequest,
            st.sampled_from(Ack),
            st.lists(
                st.builds(ProducePart, topics, u32, st.binary(max_size=60), u32),
                min_size=1,
                max_size=4,
            ).map(tuple),
            st.integers(1, 2**64 - 1),
            u16,
        ),
    ),
)
"""A request of every api, each at version 1."""

epochs = st.integers(-1, 2**31 - 1)
broker_ids = st.integers(-1, 2**31 - 1)
version_2_requests: st.SearchStrategy[Request] = st.one_of(
    st.builds(
        FetchRequest,
        topics,
        u32,
        u64,
        st.integers(1, 2**32 - 1),
        u32,
        u32,
        broker_ids,
        epochs,
        u64,
    ).filter(lambda request: request.replica_id != -1 or request.flushed_offset == 0),
    st.builds(MetadataRequest, st.lists(topics, max_size=5).map(tuple)),
)
idempotent_produce_requests: st.SearchStrategy[Request] = st.one_of(
    st.builds(
        ProduceRequest,
        topics,
        u32,
        st.sampled_from(Ack),
        st.binary(max_size=200),
        st.integers(1, 2**64 - 1),
        u16,
        u32,
    ),
    st.builds(ProduceRequest, topics, u32, st.sampled_from(Ack), st.binary(max_size=200)),
)
"""PRODUCE version 3's: an idempotent producer's (id above 0), or none's (id, epoch and
sequence 0)."""
versioned_requests: st.SearchStrategy[tuple[int, Request]] = st.one_of(
    st.tuples(st.just(1), requests),
    st.tuples(st.just(2), version_2_requests),
    st.tuples(st.just(PRODUCE_IDEMPOTENT_VERSION), idempotent_produce_requests),
)
"""(api_version, request) of every api and version."""

metadata_replies = st.builds(
    MetadataReply,
    st.lists(st.builds(MetadataBroker, u32, texts, u16), max_size=3).map(tuple),
    st.lists(
        st.builds(
            TopicInfo,
            topics,
            st.sampled_from(ErrorCode),
            st.lists(
                st.builds(PartitionInfo, u32, u32, st.sampled_from(ErrorCode)), max_size=4
            ).map(tuple),
        ),
        max_size=3,
    ).map(tuple),
)

group_members = st.builds(
    GroupMemberInfo,
    texts,
    texts,
    texts,
    texts,
    i32,
    st.booleans(),
    u32,
    u32,
    st.lists(topics, max_size=2).map(tuple),
    partition_lists(),
    partition_lists(),
    partition_lists(),
)
group_replies: st.SearchStrategy[tuple[Api, Reply]] = st.one_of(
    st.tuples(
        st.just(Api.GROUP_HEARTBEAT), st.builds(GroupHeartbeatReply, i32, u32, partition_lists())
    ),
    st.tuples(
        st.just(Api.OFFSET_COMMIT),
        st.builds(
            OffsetCommitReply,
            st.lists(
                st.builds(CommitPartReply, topics, u32, st.sampled_from(ErrorCode)), max_size=4
            ).map(tuple),
        ),
    ),
    st.tuples(
        st.just(Api.OFFSET_FETCH),
        st.builds(
            OffsetFetchReply,
            st.lists(
                st.builds(
                    CommittedTopic,
                    topics,
                    st.lists(st.builds(CommittedOffset, u32, u64), max_size=3).map(tuple),
                ),
                max_size=3,
            ).map(tuple),
        ),
    ),
    st.tuples(
        st.just(Api.DESCRIBE_GROUP),
        st.builds(
            DescribeGroupReply,
            st.integers(0, 255),
            i32,
            i32,
            i32,
            texts,
            st.lists(group_members, max_size=3).map(tuple),
        ),
    ),
    st.tuples(
        st.just(Api.LIST_GROUPS),
        st.builds(
            ListGroupsReply,
            st.lists(
                st.builds(
                    GroupListing,
                    texts,
                    i32,
                    st.lists(texts, max_size=3).map(tuple),
                    st.lists(topics, max_size=3).map(tuple),
                ),
                max_size=3,
            ).map(tuple),
        ),
    ),
    st.tuples(st.just(Api.DELETE_GROUP), st.just(EmptyReply())),
)
"""A reply of every consumer group api."""

replies: st.SearchStrategy[tuple[Api, Reply]] = st.one_of(
    group_replies,
    st.tuples(st.just(Api.PRODUCE), st.builds(ProduceReply, u64, u32)),
    st.tuples(st.just(Api.FETCH), st.builds(FetchReply, u64, u64, st.binary(max_size=200))),
    st.tuples(st.just(Api.OFFSETS), st.builds(OffsetsReply, u64)),
    st.tuples(st.just(Api.METADATA), metadata_replies),
    st.tuples(
        st.sampled_from(
            [Api.CREATE_TOPIC, Api.DELETE_TOPIC, Api.ALTER_CONFIG, Api.CREATE_PARTITIONS]
        ),
        st.just(EmptyReply()),
    ),
    st.tuples(
        st.just(Api.DESCRIBE_CLUSTER),
        st.builds(
            DescribeClusterReply,
            texts,
            texts,
            st.lists(
                st.builds(
                    ClusterBroker,
                    u32,
                    st.booleans(),
                    texts,
                    u16,
                    texts,
                    st.lists(texts, max_size=3).map(tuple),
                    u32,
                ),
                max_size=3,
            ).map(tuple),
        ),
    ),
    st.tuples(
        st.just(Api.DESCRIBE_PARTITION),
        st.builds(
            DescribePartitionReply,
            u64,
            u64,
            u64,
            u64,
            u32,
            st.integers(-(2**63), 2**63 - 1),
            st.dictionaries(texts, texts, max_size=7),
        ),
    ),
    st.tuples(
        st.just(Api.DESCRIBE_CONFIG),
        st.builds(
            DescribeConfigReply,
            st.lists(st.builds(ConfigEntry, texts, texts, st.booleans()), max_size=7).map(tuple),
        ),
    ),
    st.tuples(
        st.just(Api.OFFSET_FOR_LEADER_EPOCH), st.builds(OffsetForLeaderEpochReply, epochs, u64)
    ),
    st.tuples(
        st.just(Api.MULTI_PRODUCE),
        st.builds(
            MultiProduceReply,
            st.lists(st.builds(PartReply, topics, u32, st.binary(max_size=40)), max_size=4).map(
                tuple
            ),
            u32,
        ),
    ),
)
"""A reply of every api, each at version 1."""


@st.composite
def epoch_entries(draw: st.DrawFn) -> tuple[EpochEntry, ...]:
    """A leader-epoch checkpoint's entries: epochs rising from 0, start offsets rising."""
    found = sorted(set(draw(st.lists(st.integers(0, 2**31 - 1), max_size=4))))
    starts = sorted(draw(st.lists(u64, min_size=len(found), max_size=len(found), unique=True)))
    return tuple(EpochEntry(e, s) for e, s in zip(found, starts, strict=True))


version_2_replies: st.SearchStrategy[tuple[Api, Reply]] = st.one_of(
    st.tuples(
        st.just(Api.FETCH),
        st.builds(FetchReply, u64, u64, st.binary(max_size=200), epochs, epoch_entries()),
    ),
    st.tuples(
        st.just(Api.METADATA),
        st.builds(
            MetadataReply,
            st.lists(st.builds(MetadataBroker, u32, texts, u16, texts), max_size=3).map(tuple),
            st.lists(
                st.builds(
                    TopicInfo,
                    topics,
                    st.sampled_from(ErrorCode),
                    st.lists(
                        st.builds(
                            PartitionInfo,
                            u32,
                            broker_ids,
                            st.sampled_from(ErrorCode),
                            epochs,
                            st.lists(u32, max_size=4).map(tuple),
                            st.lists(u32, max_size=4).map(tuple),
                        ),
                        max_size=4,
                    ).map(tuple),
                ),
                max_size=3,
            ).map(tuple),
        ),
    ),
)


@given(versioned_requests, u32, texts)
def test_every_request_decodes_to_what_was_encoded(
    versioned: tuple[int, Request], correlation_id: int, client_id: str
) -> None:
    version, request = versioned
    header = RequestHeader(request.api, version, correlation_id, client_id)
    frames = encode_request(header, request)
    assert len(frames) == 1
    assert decode_request(frames) == (header, request)


@given(versioned_requests, u32)
def test_peek_route_agrees_with_decode_request(
    versioned: tuple[int, Request], correlation_id: int
) -> None:
    version, request = versioned
    frames = encode_request(RequestHeader(request.api, version, correlation_id, "c"), request)
    _, decoded = decode_request(frames)
    route = KnownPrefixes().route(frames)
    if isinstance(
        decoded,
        ProduceRequest
        | FetchRequest
        | OffsetsRequest
        | DescribePartitionRequest
        | OffsetForLeaderEpochRequest,
    ):
        assert route == Route(decoded.topic, decoded.partition)
    else:
        assert route is None
    assert peek_correlation_id(frames) == correlation_id
    fire_and_forget = (
        isinstance(decoded, ProduceRequest | MultiProduceRequest) and decoded.ack is Ack.NONE
    )
    assert is_fire_and_forget(frames) == fire_and_forget


@given(versioned_requests, u32, u32)
def test_peek_produce_decodes_a_known_prefix_as_decode_request_does(
    versioned: tuple[int, Request], first_id: int, correlation_id: int
) -> None:
    version, request = versioned
    prefixes = KnownPrefixes()
    prefixes.decode(encode_request(RequestHeader(request.api, version, first_id, "peek"), request))
    frames = encode_request(RequestHeader(request.api, version, correlation_id, "peek"), request)
    peeked = prefixes.produce(frames)
    if isinstance(request, ProduceRequest):
        assert peeked is not None
        cid, peeked_version, route, ack, producer_id, epoch, sequence, message_set = peeked
        assert (cid, peeked_version, route, ack, producer_id, epoch, sequence) == (
            correlation_id,
            version,
            Route(request.topic, request.partition),
            request.ack,
            request.producer_id,
            request.producer_epoch,
            request.sequence,
        )
        assert bytes(message_set) == bytes(request.message_set)
    else:
        assert peeked is None


@given(replies, u32)
def test_every_reply_decodes_to_what_was_encoded(api_reply: tuple[Api, Reply], cid: int) -> None:
    api, reply = api_reply
    frames = encode_reply(cid, reply)
    assert len(frames) == (2 if api is Api.FETCH else 1)
    assert decode_reply(api, frames) == reply
    assert decode_reply_header(frames) == decode_reply_header([frames[0]])
    assert decode_reply_header(frames).correlation_id == cid


@given(version_2_replies, u32)
def test_every_version_2_reply_decodes_to_what_was_encoded(
    api_reply: tuple[Api, Reply], cid: int
) -> None:
    api, reply = api_reply
    frames = encode_reply(cid, reply, 2)
    assert decode_reply(api, frames, 2) == reply


@given(version_2_replies, u32)
def test_a_version_2_reply_at_version_1_leaves_the_version_2_fields_out(
    api_reply: tuple[Api, Reply], cid: int
) -> None:
    """What a version 1 client gets: the version 1 fields, and for a partition without a
    leader its preferred one (ValueError when it has no replicas to name either)."""
    api, reply = api_reply
    if isinstance(reply, FetchReply):
        expected: Reply = FetchReply(reply.high_watermark, reply.log_start_offset, b"")
    else:
        assert isinstance(reply, MetadataReply)
        if any(p.broker_id == -1 and not p.replicas for t in reply.topics for p in t.partitions):
            with pytest.raises(ValueError, match="broker_id -1 and no replicas"):
                encode_reply(cid, reply, 1)
            return
        expected = MetadataReply(
            tuple(MetadataBroker(b.broker_id, b.host, b.port) for b in reply.brokers),
            tuple(
                TopicInfo(
                    t.topic,
                    t.error_code,
                    tuple(
                        PartitionInfo(
                            p.partition,
                            p.replicas[0] if p.broker_id == -1 else p.broker_id,
                            p.error_code,
                        )
                        for p in t.partitions
                    ),
                )
                for t in reply.topics
            ),
        )
    decoded = decode_reply(api, encode_reply(cid, reply, 1), 1)
    if isinstance(decoded, FetchReply):
        assert bytes(decoded.message_set) == bytes(cast(FetchReply, reply).message_set)
        decoded = FetchReply(decoded.high_watermark, decoded.log_start_offset, b"")
    assert decoded == expected


@given(
    st.sampled_from([code for code in ErrorCode if code and code not in ERROR_FIELDS]),
    st.text(max_size=200),
    u32,
)
def test_every_error_reply_raises_a_broker_error_with_its_code(
    code: ErrorCode, message: str, correlation_id: int
) -> None:
    frames = encode_error(correlation_id, code, message)
    assert len(frames) == 1
    with pytest.raises(BrokerError) as raised:
        decode_reply(Api.PRODUCE, frames)
    entry = error_entry(code)
    assert entry is not None
    assert raised.value.code == code
    assert (raised.value.name, raised.value.message) == (code.name, message)
    assert raised.value.retriable == entry.retriable
    assert decode_reply_header(frames).correlation_id == correlation_id


@given(
    u32,
    st.one_of(st.just(0), st.integers(-(2**15), 2**15 - 1)),
    st.one_of(st.just(0), st.integers(0, 2**16 - 1)),
    u64,
    u32,
)
def test_a_frame_the_size_of_an_ack_decodes_only_as_what_it_says(
    correlation_id: int, code: int, message_length: int, base_offset: int, count: int
) -> None:
    # An ack's 20 bytes take a shortcut: one unpack. Bytes of that size that are not a success
    # (an error code, a message) must still raise or decode as the general reader says.
    frame = struct.pack(">IhHQI", correlation_id, code, message_length, base_offset, count)
    try:
        reply = decode_reply(Api.PRODUCE, [frame])
    except (BrokerError, MalformedReply):
        assert (code, message_length) != (0, 0)
    else:
        assert reply == ProduceReply(base_offset, count) and (code, message_length) == (0, 0)
    if (code, message_length) == (0, 0):
        expected = ReplyHeader(correlation_id, ErrorCode.NONE, "")
        assert decode_reply_header([frame]) == expected


@given(st.lists(st.binary(max_size=30), max_size=4))
def test_peeks_never_raise_on_garbage(frames: list[bytes]) -> None:
    assert 0 <= peek_correlation_id(frames) < 2**32
    assert is_fire_and_forget(frames) in (True, False)


@given(st.binary(max_size=40))
def test_peeks_never_raise_on_a_produce_frame_that_continues_with_garbage(rest: bytes) -> None:
    frames: list[Buffer] = [struct.pack(">HHI", Api.PRODUCE, 1, 3) + rest]
    assert peek_correlation_id(frames) == 3
    assert is_fire_and_forget(frames) in (True, False)


# -- zero copy ---------------------------------------------------------------------------------


def produce_frames(ack: Ack = Ack.WRITTEN, message_set: Buffer = MESSAGE) -> list[Buffer]:
    header = RequestHeader(Api.PRODUCE, 1, 7, "test")
    return encode_request(header, ProduceRequest("clicks", 3, ack, message_set))


def produce_frame(ack: Ack = Ack.WRITTEN) -> bytes:
    """The one frame of produce_frames: header 14 bytes, body 13, then MESSAGE."""
    (frame,) = produce_frames(ack)
    return bytes(frame)


ACK_AT = len(produce_frame()) - len(MESSAGE) - 1
"""The position of the ack field in produce_frame(): the last byte before the message set."""


def test_encode_request_puts_the_produce_message_set_at_the_end_of_its_one_frame() -> None:
    frames = produce_frames(message_set=memoryview(MESSAGE))
    assert len(frames) == 1
    assert bytes(frames[0])[ACK_AT + 1 :] == MESSAGE  # no length field: it runs to the end


def test_encode_reply_puts_the_fetch_message_set_in_frame_2_uncopied() -> None:
    message_set = memoryview(MESSAGE)
    frames = encode_reply(1, FetchReply(38, 0, message_set))
    assert len(frames) == 2
    assert frames[1] is message_set


def test_decoders_return_a_view_of_the_message_set_region_not_a_copy() -> None:
    request_frame = bytearray(produce_frame())
    _, request = decode_request([request_frame])
    message_set_frame = bytearray(MESSAGE)
    header_and_body = encode_reply(1, FetchReply(38, 0, b""))[0]
    reply = decode_reply(Api.FETCH, [header_and_body, message_set_frame])
    request_frame[-1] = message_set_frame[-1] = ord("!")
    assert isinstance(request, ProduceRequest)
    assert isinstance(request.message_set, memoryview)
    assert isinstance(reply.message_set, memoryview)
    assert request.message_set.obj is request_frame
    assert reply.message_set.obj is message_set_frame
    assert bytes(request.message_set)[-5:] == bytes(reply.message_set)[-5:] == b"hell!"
    assert len(request.message_set) == len(MESSAGE)


def test_decoders_take_zmq_frames() -> None:
    frames = cast(list[Buffer], [zmq.Frame(bytes(f)) for f in produce_frames()])
    header, request = decode_request(frames)
    assert isinstance(request, ProduceRequest)
    assert (header.client_id, request.topic, request.message_set) == ("test", "clicks", MESSAGE)
    assert KnownPrefixes().route(frames) == Route("clicks", 3)
    assert (peek_correlation_id(frames), is_fire_and_forget(frames)) == (7, False)
    reply_frames = cast(
        list[Buffer], [zmq.Frame(bytes(f)) for f in encode_reply(2, FetchReply(38, 0, MESSAGE))]
    )
    assert decode_reply(Api.FETCH, reply_frames).message_set == MESSAGE


def test_peek_route_never_touches_the_message_set() -> None:
    garbage = b"\xff" * 5  # not even a message length: any read of it as messages fails
    frames: list[Buffer] = [produce_frame(Ack.NONE)[: ACK_AT + 1] + garbage]
    assert KnownPrefixes().route(frames) == Route("clicks", 3)
    assert is_fire_and_forget(frames)
    _, request = decode_request(frames)  # nor does decode_request check it: the log does
    assert isinstance(request, ProduceRequest)
    assert request.message_set == garbage


# -- malformed requests ------------------------------------------------------------------------


def header(api_key: int = Api.FETCH, version: int = 1, correlation_id: int = 9) -> bytes:
    """A request header of 13 bytes, client_id "cli"; the body goes right after it."""
    return struct.pack(">HHI", api_key, version, correlation_id) + b"\x00\x03cli"


def topic(name: bytes) -> bytes:
    return struct.pack(">H", len(name)) + name


def fetch_body(name: bytes = b"clicks", max_bytes: int = 1024) -> bytes:
    return topic(name) + struct.pack(">IQIII", 0, 0, max_bytes, 100, 1)


def rejects(
    frames: list[Buffer], error: type[PylogError], *fragments: str
) -> pytest.ExceptionInfo[PylogError]:
    """Assert decode_request raises `error` whose message holds every fragment."""
    with pytest.raises(error) as raised:
        decode_request(frames)
    for fragment in fragments:
        assert fragment in str(raised.value), str(raised.value)
    return raised


HEADER_SIZE = 13
"""The size of the request header valid_requests() use: 10 bytes and client_id "cli"."""


def valid_requests() -> list[tuple[Api, bytes]]:
    """A valid request of every api, as its one frame."""
    cases: list[Request] = [
        ProduceRequest("clicks", 0, Ack.FLUSHED, MESSAGE),
        FetchRequest("clicks", 0, 0, 1024, 100, 1),
        OffsetsRequest("clicks", 0, -1),
        MetadataRequest(("clicks", "views")),
        CreateTopicRequest("clicks", 2, {"retention_ms": "none"}),
        DeleteTopicRequest("clicks"),
        DescribeClusterRequest(),
        DescribePartitionRequest("clicks", 0),
        DescribeConfigRequest("clicks"),
        AlterConfigRequest("clicks", {"retention_ms": "none"}, ("segment_bytes",)),
        OffsetForLeaderEpochRequest("clicks", 0, 3),
        GroupHeartbeatRequest(
            "g", "m-1", 1, "", 10_000, 300_000, "", ("clicks",), (GroupPartitions("clicks", (0,)),)
        ),
        OffsetCommitRequest("g", "m-1", 1, (CommitPart("clicks", 0, 38),)),
        OffsetFetchRequest("g", ("clicks",)),
        DescribeGroupRequest("g"),
        ListGroupsRequest(),
        DeleteGroupRequest("g"),
        CreatePartitionsRequest("clicks", 8),
    ]
    valid = []
    for request in cases:
        (frame,) = encode_request(RequestHeader(request.api, 1, 5, "cli"), request)
        valid.append((request.api, bytes(frame)))
    return valid


def body_end(api: Api, frame: bytes) -> int:
    """Where the body's fields end: the end of the frame, but for PRODUCE's message set."""
    return len(frame) - len(MESSAGE) if api is Api.PRODUCE else len(frame)


VALID_REQUESTS = [pytest.param(api, frame, id=api.name) for api, frame in valid_requests()]
VALID_REQUESTS_BUT_PRODUCE = [p for p in VALID_REQUESTS if p.values[0] is not Api.PRODUCE]


def test_request_without_frames_is_malformed() -> None:
    rejects([], MalformedRequest, "a request is 1 frame", "this one has 0")


@pytest.mark.parametrize("size", range(8))
def test_request_header_shorter_than_8_bytes_is_malformed_and_gets_correlation_id_0(
    size: int,
) -> None:
    frames: list[Buffer] = [header()[:size]]
    field = "api_key" if size < 2 else "api_version" if size < 4 else "correlation_id"
    rejects(frames, MalformedRequest, "request header: cut short", f"field {field}")
    assert peek_correlation_id(frames) == 0


def test_request_header_cut_inside_client_id_is_malformed_but_keeps_its_correlation_id() -> None:
    frames: list[Buffer] = [header()[:-1]]
    rejects(frames, MalformedRequest, "request header: cut short", "field client_id")
    assert peek_correlation_id(frames) == 9


def test_the_body_starts_right_after_client_id() -> None:
    # A byte between client_id and the body is read as the body's first: here it shifts the
    # FETCH body: its topic length becomes 0 and 7 bytes are left over at the end.
    rejects(
        [header() + b"\x00" + fetch_body()],
        MalformedRequest,
        "FETCH body: 7 trailing bytes after the last field, min_bytes, which ends at byte 39",
    )


def test_client_id_that_is_not_utf8_is_malformed() -> None:
    bad = struct.pack(">HHI", Api.FETCH, 1, 9) + b"\x00\x02\xc3\x28"
    rejects([bad + fetch_body()], MalformedRequest, "request header", "field client_id", "UTF-8")


def test_topic_that_is_not_utf8_is_malformed() -> None:
    rejects(
        [header() + fetch_body(b"\xff")],
        MalformedRequest,
        "FETCH body",
        "field topic is not valid UTF-8",
        "at byte 15",
    )


def test_unknown_api_key_is_unsupported_api() -> None:
    raised = rejects([header(api_key=99) + fetch_body()], UnsupportedApi, "api_key 99")
    assert error_code_for(raised.value) is ErrorCode.UNSUPPORTED_API


def test_unknown_api_key_wins_over_an_unknown_version() -> None:
    raised = rejects([header(api_key=99, version=7)], UnsupportedApi)
    assert error_code_for(raised.value) is ErrorCode.UNSUPPORTED_API


def test_known_api_with_another_version_is_unsupported_version() -> None:
    raised = rejects([header(version=6)], UnsupportedVersion, "FETCH version 6", "3, 4 and 5")
    assert isinstance(raised.value, UnsupportedApi)
    assert error_code_for(raised.value) is ErrorCode.UNSUPPORTED_VERSION


@pytest.mark.parametrize(("api", "frame"), VALID_REQUESTS)
def test_request_of_other_than_one_frame_is_malformed(api: Api, frame: bytes) -> None:
    # 0 frames, a second frame (the old body or message set frame), and the empty delimiter
    # of a REQ envelope that reached the decoder: none is a request, whatever frame 1 says.
    wrong_counts: list[list[Buffer]] = [[], [frame, b""], [frame, MESSAGE], [b"", frame]]
    for frames in wrong_counts:
        rejects(frames, MalformedRequest, "a request is 1 frame", f"this one has {len(frames)}")
        with pytest.raises(MalformedRequest):
            KnownPrefixes().route(frames)
        assert not is_fire_and_forget(frames)
    assert peek_correlation_id([frame, b""]) == 5  # the first frame's, as long as it has one
    assert peek_correlation_id([b"", frame]) == 0


def test_the_frame_count_is_checked_before_the_api_key() -> None:
    rejects([header(api_key=99), b""], MalformedRequest, "a request is 1 frame")


@pytest.mark.parametrize(("api", "frame"), VALID_REQUESTS)
def test_request_cut_anywhere_before_its_message_set_is_malformed(api: Api, frame: bytes) -> None:
    for size in range(body_end(api, frame)):
        where = "request header" if size < HEADER_SIZE else f"{api.name} body"
        rejects([frame[:size]], MalformedRequest, f"{where}: cut short")


def test_produce_request_cut_inside_its_message_set_decodes_with_the_shorter_set() -> None:
    # Framing of the message set is the partition log's to check, not the decoder's.
    frame = produce_frame()
    for size in range(ACK_AT + 1, len(frame) + 1):
        _, request = decode_request([frame[:size]])
        assert isinstance(request, ProduceRequest)
        assert request.message_set == MESSAGE[: size - ACK_AT - 1]


@pytest.mark.parametrize(("api", "frame"), VALID_REQUESTS_BUT_PRODUCE)
def test_request_body_with_trailing_bytes_is_malformed(api: Api, frame: bytes) -> None:
    if len(frame) == HEADER_SIZE:  # a body of no fields
        where = f"{api.name} body: must be empty, it has 2 bytes from byte {len(frame)}"
        rejects([frame + b"\x00\x00"], MalformedRequest, where)
        return
    where = f"{api.name} body: 2 trailing bytes after the last field"
    rejects([frame + b"\x00\x00"], MalformedRequest, where, f"which ends at byte {len(frame)}")


def test_bytes_after_a_produce_body_are_its_message_set() -> None:
    _, request = decode_request([produce_frame() + b"\x00\x00"])
    assert isinstance(request, ProduceRequest)
    assert request.message_set == MESSAGE + b"\x00\x00"


def test_fetch_request_with_trailing_bytes_is_malformed() -> None:
    frames: list[Buffer] = [header() + fetch_body() + b"\x01"]
    rejects(frames, MalformedRequest, "after the last field, min_bytes")


def test_fetch_request_cut_inside_max_wait_ms_names_that_field() -> None:
    frames: list[Buffer] = [header() + fetch_body()[:-6]]
    rejects(frames, MalformedRequest, "cut short in field max_wait_ms", "from byte 37")


def test_fetch_request_with_max_bytes_0_is_malformed() -> None:
    rejects([header() + fetch_body(max_bytes=0)], MalformedRequest, "field max_bytes is 0")


# -- replication: versions 2, OFFSET_FOR_LEADER_EPOCH, ack 3 ----------------------------------


def fetch_v2_body(replica_id: int = 2, leader_epoch: int = 5, flushed_offset: int = 0) -> bytes:
    return fetch_body() + struct.pack(">iiQ", replica_id, leader_epoch, flushed_offset)


def test_a_version_1_fetch_has_the_version_2_defaults_of_a_consumer() -> None:
    _, request = decode_request([header() + fetch_body()])
    assert isinstance(request, FetchRequest)
    assert (request.replica_id, request.leader_epoch, request.flushed_offset) == (-1, -1, 0)


def test_a_version_2_fetch_reads_the_replica_fields() -> None:
    header_, request = decode_request([header(version=2) + fetch_v2_body(2, 5, 76)])
    assert header_.version == 2
    assert request == FetchRequest("clicks", 0, 0, 1024, 100, 1, 2, 5, 76)


def test_the_fetch_fields_are_read_by_the_version_the_header_says() -> None:
    rejects([header(version=2) + fetch_body()], MalformedRequest, "cut short in field replica_id")
    rejects(
        [header(version=1) + fetch_v2_body()],
        MalformedRequest,
        "16 trailing bytes after the last field, min_bytes",
    )


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ((-2, 5, 0), "field replica_id is -2"),
        ((2, -2, 0), "field leader_epoch is -2"),
        ((-1, -1, 38), "field flushed_offset is 38: a consumer's (replica_id -1) must be 0"),
    ],
)
def test_version_2_fetch_fields_out_of_range_are_malformed(
    fields: tuple[int, int, int], fragment: str
) -> None:
    rejects([header(version=2) + fetch_v2_body(*fields)], MalformedRequest, "FETCH body", fragment)


def test_a_version_1_fetch_cannot_carry_the_replica_fields() -> None:
    header_ = RequestHeader(Api.FETCH, 1, 1, "c")
    for fields_ in ({"replica_id": 2}, {"leader_epoch": 0}, {"flushed_offset": 1}):
        request = FetchRequest("clicks", 0, 0, 1, 0, 0, **fields_)
        with pytest.raises(ValueError, match=rf"field {next(iter(fields_))} .* \(send version 2\)"):
            encode_request(header_, request)


@pytest.mark.parametrize(
    ("request_", "version"),
    [(ProduceRequest("clicks", 0, Ack.ALL, MESSAGE), 4), (FetchRequest("c", 0, 0, 1, 0, 0), 6)],
)
def test_encode_request_refuses_a_version_the_api_does_not_have(
    request_: Request, version: int
) -> None:
    with pytest.raises(ValueError, match=f"{request_.api.name} has no version {version}"):
        encode_request(RequestHeader(request_.api, version, 1, "c"), request_)


def test_apis_but_those_of_newer_versions_have_version_1_only() -> None:
    newer = {
        Api.PRODUCE: (1, 2, 3),
        Api.FETCH: (1, 2, 3, 4, 5),
        Api.METADATA: (1, 2),
        Api.DESCRIBE_PARTITION: (1, 2),
        Api.MULTI_FETCH: (1, 2),
    }
    for api in Api:
        spoken = newer.get(api, (1,))
        assert API_VERSIONS[api] == spoken, api
        for version in (0, spoken[-1] + 1):
            raised = rejects([header(api, version) + fetch_body()], UnsupportedVersion)
            assert f"{api.name} version {version} is not supported" in str(raised.value)


def test_offset_for_leader_epoch_below_minus_1_is_malformed() -> None:
    body = topic(b"clicks") + struct.pack(">Ii", 0, -2)
    rejects(
        [header(Api.OFFSET_FOR_LEADER_EPOCH) + body],
        MalformedRequest,
        "OFFSET_FOR_LEADER_EPOCH body: field leader_epoch is -2",
    )


def test_produce_with_ack_all_is_answered_and_peeked() -> None:
    frames = produce_frames(Ack.ALL)
    assert not is_fire_and_forget(frames)
    prefixes = KnownPrefixes()
    _, request = prefixes.decode(frames)
    assert isinstance(request, ProduceRequest) and request.ack is Ack.ALL
    peeked = prefixes.produce(frames)
    assert peeked is not None and peeked[3] == Ack.ALL


def fetch_v2_reply(*entries: tuple[int, int], leader_epoch: int = 5) -> list[Buffer]:
    body = struct.pack(">QQiH", 76, 0, leader_epoch, len(entries))
    body += b"".join(struct.pack(">iQ", e, s) for e, s in entries)
    return [struct.pack(">IhH", 1, 0, 0) + body, MESSAGE]


def test_a_version_2_fetch_reply_reads_the_epoch_entries() -> None:
    reply = decode_reply(Api.FETCH, fetch_v2_reply((5, 38), (6, 40), (8, 50)), 2)
    assert reply.leader_epoch == 5
    assert reply.epochs == (EpochEntry(5, 38), EpochEntry(6, 40), EpochEntry(8, 50))


@pytest.mark.parametrize(
    ("entries", "leader_epoch", "fragment"),
    [
        (((5, 38), (5, 40)), 5, "epoch entry 1, (5, 40), does not follow (5, 38)"),
        (((5, 38), (6, 37)), 6, "epoch entry 1, (6, 37), does not follow (5, 38)"),
        (((5, 38), (6, 38)), 6, "epochs and start offsets must rise"),
        (((-1, 0),), 5, "epoch entry 0 has epoch -1"),
        ((), -2, "field leader_epoch is -2"),
    ],
)
def test_version_2_fetch_replies_with_epochs_out_of_order_are_malformed(
    entries: tuple[tuple[int, int], ...], leader_epoch: int, fragment: str
) -> None:
    with pytest.raises(MalformedReply, match=re.escape(fragment)):
        decode_reply(Api.FETCH, fetch_v2_reply(*entries, leader_epoch=leader_epoch), 2)


def test_a_version_2_reply_read_as_version_1_has_trailing_bytes() -> None:
    with pytest.raises(MalformedReply, match="6 trailing bytes after the last field"):
        decode_reply(Api.FETCH, fetch_v2_reply(), 1)


def test_metadata_version_2_leader_below_minus_1_is_malformed() -> None:
    partition = struct.pack(">IiiHH", 0, -2, 0, 0, 0) + b"\x00\x00"
    body = struct.pack(">HH", 0, 1) + topic(b"t") + struct.pack(">hI", 0, 1) + partition
    with pytest.raises(MalformedReply, match="field leader is -2"):
        decode_reply(Api.METADATA, [struct.pack(">IhH", 1, 0, 0) + body], 2)


def test_offset_for_leader_epoch_reply_epoch_below_minus_1_is_malformed() -> None:
    frame = struct.pack(">IhHiQ", 1, 0, 0, -2, 38)
    with pytest.raises(MalformedReply, match="field epoch is -2"):
        decode_reply(Api.OFFSET_FOR_LEADER_EPOCH, [frame])


def test_replies_of_a_version_the_api_does_not_have_are_refused() -> None:
    with pytest.raises(ValueError, match="PRODUCE has no version 4"):
        encode_reply(1, ProduceReply(0, 1), 4)
    with pytest.raises(ValueError, match="OFFSETS has no version 2"):
        decode_reply(Api.OFFSETS, [struct.pack(">IhHQ", 1, 0, 0, 0)], 2)


@pytest.mark.parametrize("ack", [4, 255])
def test_produce_request_with_ack_out_of_range_is_malformed(ack: int) -> None:
    frame = produce_frame()
    bad = frame[:ACK_AT] + bytes([ack]) + frame[ACK_AT + 1 :]
    rejects([bad], MalformedRequest, f"PRODUCE body: field ack is {ack}")


def test_peek_produce_knows_a_prefix_only_once_decode_request_passed_it() -> None:
    (frame,) = encode_request(
        RequestHeader(Api.PRODUCE, 1, 1, "first-seen"),
        ProduceRequest("clicks", 3, Ack.NONE, MESSAGE),
    )
    prefixes = KnownPrefixes()
    assert prefixes.produce([frame]) is None
    decode_request([frame])  # decoded, not remembered: the prefixes' user remembers
    assert prefixes.produce([frame]) is None
    prefixes.decode([frame])
    peeked = prefixes.produce([frame])
    assert peeked is not None
    assert peeked[:4] == (1, 1, Route("clicks", 3), Ack.NONE)
    assert peeked[4:7] == (0, 0, 0)  # no idempotent producer before version 3
    assert peeked[7] == memoryview(MESSAGE)


def test_a_known_prefix_does_not_pass_what_follows_it() -> None:
    frame = produce_frame()
    prefixes = KnownPrefixes()
    prefixes.decode([frame])
    assert prefixes.produce([frame]) is not None
    bad_ack = frame[:ACK_AT] + b"\x04" + frame[ACK_AT + 1 :]
    assert prefixes.produce([bad_ack]) is None
    rejects([bad_ack], MalformedRequest, "PRODUCE body: field ack is 4")
    assert prefixes.produce([frame[:ACK_AT]]) is None
    rejects([frame[:ACK_AT]], MalformedRequest, "cut short in field ack")
    assert prefixes.produce([frame, b""]) is None
    with pytest.raises(MalformedRequest, match="this one has 2"):
        prefixes.route([frame, b""])


def test_a_refused_prefix_is_refused_every_time() -> None:
    frame = header(Api.FETCH) + fetch_body(name=b"bad name")
    prefixes = KnownPrefixes()
    for _ in range(2):
        with pytest.raises(InvalidTopic):
            prefixes.route([frame])
        rejects([frame], InvalidTopic)


def test_peek_produce_is_none_for_requests_other_than_produce() -> None:
    prefixes = KnownPrefixes()
    for _, frame in valid_requests():
        prefixes.decode([frame])
    assert [api for api, frame in valid_requests() if prefixes.produce([frame])] == [Api.PRODUCE]


def test_offsets_request_with_time_below_earliest_is_malformed() -> None:
    body = topic(b"clicks") + struct.pack(">Iq", 0, -3)
    rejects([header(Api.OFFSETS) + body], MalformedRequest, "field time is -3")


BAD_TOPIC_NAMES = ["", ".", "..", "a b", "a/b", "clicks\n", "é", "x" * 250]


@pytest.mark.parametrize("name", BAD_TOPIC_NAMES)
def test_bad_topic_names_are_invalid_topic(name: str) -> None:
    with pytest.raises(InvalidTopic, match="topic name"):
        check_topic_name(name)
    rejects([header() + fetch_body(name.encode())], InvalidTopic, "topic name")


@pytest.mark.parametrize("name", ["a", "A-z_0.9", "...", "x" * 249, "-"])
def test_good_topic_names_pass(name: str) -> None:
    check_topic_name(name)


def test_metadata_request_with_a_bad_topic_is_invalid_topic() -> None:
    body = struct.pack(">H", 2) + topic(b"clicks") + topic(b"..")
    rejects([header(Api.METADATA) + body], InvalidTopic, "'..'")


def test_metadata_request_cut_inside_a_topic_names_the_topic() -> None:
    body = struct.pack(">H", 2) + topic(b"clicks") + topic(b"views")[:-1]
    rejects([header(Api.METADATA) + body], MalformedRequest, "METADATA body", "field topic[1]")


def test_create_topic_request_with_0_partitions_is_invalid_topic() -> None:
    body = topic(b"clicks") + struct.pack(">IH", 0, 0)
    rejects([header(Api.CREATE_TOPIC) + body], InvalidTopic, "partitions is 0")


def test_create_topic_request_with_a_setting_given_twice_is_invalid_topic() -> None:
    pair = topic(b"retention_ms") + topic(b"1000")
    body = topic(b"clicks") + struct.pack(">IH", 1, 2) + pair + pair
    rejects([header(Api.CREATE_TOPIC) + body], InvalidTopic, "'retention_ms' is given twice")


def test_create_topic_request_cut_inside_a_value_names_it() -> None:
    body = topic(b"clicks") + struct.pack(">IH", 1, 1) + topic(b"retention_ms") + b"\x00\x04no"
    rejects([header(Api.CREATE_TOPIC) + body], MalformedRequest, "field value[0]")


# -- encoding what the wire cannot carry -------------------------------------------------------


def test_encoding_a_number_out_of_its_type_names_the_field() -> None:
    request = FetchRequest("clicks", 2**32, 0, 1, 0, 0)
    with pytest.raises(ValueError, match="field partition is 4294967296: not a u32"):
        encode_request(RequestHeader(Api.FETCH, 1, 1), request)
    with pytest.raises(ValueError, match="field offset is -1: not a u64"):
        encode_reply(1, OffsetsReply(-1))


def test_encoding_a_string_over_65535_bytes_names_the_field() -> None:
    with pytest.raises(ValueError, match="field client_id is 65536 bytes"):
        encode_request(RequestHeader(Api.DELETE_TOPIC, 1, 1, "x" * 65536), DeleteTopicRequest("x"))


def test_encode_request_refuses_a_header_for_another_api() -> None:
    with pytest.raises(ValueError, match="the header says FETCH, the request is DELETE_TOPIC"):
        encode_request(RequestHeader(Api.FETCH, 1, 1), DeleteTopicRequest("x"))


def test_an_error_message_over_65535_bytes_is_cut_at_a_character_boundary() -> None:
    frames = encode_error(3, ErrorCode.STORAGE_ERROR, "é" * 40_000)
    header_ = decode_reply_header(frames)
    assert header_.error_message == "é" * (65535 // 2)


def test_encode_error_refuses_none() -> None:
    with pytest.raises(ValueError, match="not an error"):
        encode_error(1, ErrorCode.NONE)


def test_an_unexpected_exception_is_answered_with_its_type_and_text() -> None:
    header_ = decode_reply_header(encode_error(4, KeyError("segment")))
    assert (header_.error_code, header_.error_message) == (1, "KeyError: 'segment'")


# -- fire and forget, correlation ids, routing -------------------------------------------------


def test_produce_with_ack_none_is_fire_and_forget_even_when_malformed() -> None:
    frame = produce_frame(Ack.NONE)
    assert is_fire_and_forget([frame])
    assert is_fire_and_forget([frame[: ACK_AT + 1]])  # no message set
    assert is_fire_and_forget([frame[: ACK_AT + 1] + b"junk"])  # a message set of garbage
    bad_topic = topic(b"a b") + struct.pack(">IB", 0, 0)
    assert is_fire_and_forget([header(Api.PRODUCE) + bad_topic + MESSAGE])
    bad_client_id = struct.pack(">HHI", Api.PRODUCE, 1, 9) + b"\x00\x01\xff"
    assert is_fire_and_forget([bad_client_id + topic(b"clicks") + struct.pack(">IB", 0, 0)])


def test_produce_with_ack_written_or_flushed_is_answered() -> None:
    assert not is_fire_and_forget(produce_frames(Ack.WRITTEN))
    assert not is_fire_and_forget(produce_frames(Ack.FLUSHED))


def test_produce_whose_frame_stops_before_ack_is_answered() -> None:
    frame = produce_frame(Ack.NONE)
    for size in range(ACK_AT + 1):  # cut in the header, client_id, topic, partition
        assert not is_fire_and_forget([frame[:size]]), size


def test_produce_whose_topic_length_runs_past_the_frame_is_answered() -> None:
    # 00 ff as a topic length would put "ack" past the end: nothing to read there.
    frame = header(Api.PRODUCE) + b"\x00\xff" + struct.pack(">IB", 0, 0)
    assert not is_fire_and_forget([frame])


def test_other_apis_and_versions_are_answered() -> None:
    body = produce_frame(Ack.NONE)[14:]  # after produce_frame's 14-byte header
    assert is_fire_and_forget([header(Api.PRODUCE) + body])
    assert not is_fire_and_forget([header(Api.FETCH) + body])
    assert is_fire_and_forget([header(Api.PRODUCE, version=2) + body])
    assert is_fire_and_forget([header(Api.PRODUCE, version=3) + body])
    assert not is_fire_and_forget([header(Api.PRODUCE, version=4) + body])


def test_peek_route_is_none_for_the_apis_the_front_serves() -> None:
    routes = {api: KnownPrefixes().route([frame]) for api, frame in valid_requests()}
    assert routes == {
        Api.PRODUCE: Route("clicks", 0),
        Api.FETCH: Route("clicks", 0),
        Api.OFFSETS: Route("clicks", 0),
        Api.METADATA: None,
        Api.CREATE_TOPIC: None,
        Api.DELETE_TOPIC: None,
        Api.DESCRIBE_CLUSTER: None,
        Api.DESCRIBE_PARTITION: Route("clicks", 0),
        Api.DESCRIBE_CONFIG: None,
        Api.ALTER_CONFIG: None,
        Api.OFFSET_FOR_LEADER_EPOCH: Route("clicks", 0),
        Api.GROUP_HEARTBEAT: None,
        Api.OFFSET_COMMIT: None,
        Api.OFFSET_FETCH: None,
        Api.DESCRIBE_GROUP: None,
        Api.LIST_GROUPS: None,
        Api.DELETE_GROUP: None,
        Api.CREATE_PARTITIONS: None,
    }


@pytest.mark.parametrize(
    ("frames", "error"),
    [
        ([], MalformedRequest),
        ([b"\x00\x01\x00"], MalformedRequest),
        ([header()[:-1]], MalformedRequest),
        ([header(api_key=99) + fetch_body()], UnsupportedApi),
        ([header(version=0) + fetch_body()], UnsupportedVersion),
        ([header() + fetch_body(), b""], MalformedRequest),
        ([b"", header() + fetch_body()], MalformedRequest),
        ([header() + fetch_body(b"a b")], InvalidTopic),
        ([header() + fetch_body()[:9]], MalformedRequest),
    ],
)
def test_peek_route_refuses_what_decode_request_refuses_in_what_it_reads(
    frames: list[Buffer], error: type[PylogError]
) -> None:
    with pytest.raises(error):
        KnownPrefixes().route(frames)
    with pytest.raises(error):
        decode_request(frames)


# -- malformed replies -------------------------------------------------------------------------


def reply_rejects(api: Api, frames: list[Buffer], *fragments: str) -> None:
    with pytest.raises(MalformedReply) as raised:
        decode_reply(api, frames)
    for fragment in fragments:
        assert fragment in str(raised.value), str(raised.value)


def test_reply_without_frames_is_malformed() -> None:
    reply_rejects(Api.FETCH, [], "no header")


def test_reply_header_cut_short_is_malformed() -> None:
    reply_rejects(Api.FETCH, [b"\x00\x00\x00\x01\x00"], "reply header: cut short", "error_code")


def test_error_reply_with_bytes_after_its_header_is_malformed() -> None:
    (frame,) = encode_error(1, ErrorCode.DISK_FULL)
    where = (
        "reply header: 1 trailing byte after the last field, error_message, which ends at byte 8"
    )
    reply_rejects(Api.PRODUCE, [bytes(frame) + b"\x00"], where)


def test_error_reply_with_a_second_frame_is_malformed() -> None:
    frames = encode_error(1, ErrorCode.DISK_FULL)
    reply_rejects(Api.PRODUCE, [*frames, b""], "an error reply is 1 frame", "this one has 2")


def test_success_reply_without_its_body_is_malformed() -> None:
    (frame,) = encode_reply(1, OffsetsReply(5))
    header_only = bytes(frame)[:8]
    reply_rejects(Api.OFFSETS, [header_only], "OFFSETS reply body: cut short in field offset")


def test_success_reply_with_a_second_frame_is_malformed() -> None:
    frames = encode_reply(1, OffsetsReply(5))
    reply_rejects(Api.OFFSETS, [*frames, b""], "a OFFSETS reply is 1 frame", "this one has 2")


def test_fetch_reply_without_its_message_set_is_malformed() -> None:
    frames = encode_reply(1, FetchReply(38, 0, MESSAGE))
    reply_rejects(Api.FETCH, frames[:1], "a FETCH reply is 2 frames", "this one has 1")


@pytest.mark.parametrize(
    "reply",
    [ProduceReply(0, 1), FetchReply(38, 0, b""), OffsetsReply(5), MetadataReply((), ())],
    ids=lambda reply: type(reply).__name__,
)
def test_success_reply_cut_anywhere_is_malformed(reply: Reply) -> None:
    frames = encode_reply(1, reply)
    api = {ProduceReply: Api.PRODUCE, FetchReply: Api.FETCH, OffsetsReply: Api.OFFSETS}.get(
        type(reply), Api.METADATA
    )
    frame = bytes(frames[0])
    for size in range(len(frame)):
        where = "reply header" if size < 8 else f"{api.name} reply body"
        reply_rejects(api, [frame[:size], *frames[1:]], f"{where}: cut short")


def test_reply_body_with_trailing_bytes_is_malformed() -> None:
    (frame,) = encode_reply(1, ProduceReply(0, 1))
    reply_rejects(
        Api.PRODUCE, [bytes(frame) + b"\x00"], "PRODUCE reply body: 1 trailing byte", "count"
    )


def test_empty_reply_with_bytes_in_its_body_is_malformed() -> None:
    (frame,) = encode_reply(1, EmptyReply())
    where = "DELETE_TOPIC reply body: must be empty, it has 1 byte from byte 8"
    reply_rejects(Api.DELETE_TOPIC, [bytes(frame) + b"\x00"], where)


def test_metadata_reply_cut_inside_a_partition_is_malformed() -> None:
    partition = PartitionInfo(0, 1, ErrorCode.PARTITION_UNAVAILABLE)
    reply = MetadataReply((), (TopicInfo("clicks", ErrorCode.NONE, (partition,)),))
    (frame,) = encode_reply(1, reply)
    reply_rejects(Api.METADATA, [bytes(frame)[:-1]], "field error_code")


def test_an_error_code_from_a_newer_broker_is_a_broker_error_that_is_not_retriable() -> None:
    frames = [struct.pack(">Ih", 1, 99) + b"\x00\x03new"]
    with pytest.raises(BrokerError) as raised:
        decode_reply(Api.FETCH, frames)
    assert (raised.value.code, raised.value.name, raised.value.retriable) == (
        99,
        "UNKNOWN_ERROR_99",
        False,
    )
    assert str(raised.value) == "UNKNOWN_ERROR_99: new"


# -- the error table ---------------------------------------------------------------------------

ABSTRACT_ERRORS = {PylogError, StorageError, errors.RequestError, Unavailable}
"""Roots of branches of the error tree: nothing raises them as they are."""
NOT_FROM_THE_BROKER = {
    BrokerError,
    MalformedReply,
    errors.ZooKeeperStartError,
    errors.AuthenticationFailed,
    errors.ConnectionRefused,
}
"""Raised on the client side, or before the broker serves anything: never sent on the wire."""


def test_every_error_class_the_broker_raises_has_its_own_code() -> None:
    raised_by_broker = {
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, PylogError)
        and not issubclass(cls, BrokerError)  # BrokerError's subclasses are client side too
        and cls not in ABSTRACT_ERRORS | NOT_FROM_THE_BROKER
    }
    in_table = {entry.exception for entry in ERROR_TABLE} - {None}
    assert raised_by_broker | {UnsupportedVersion} == in_table


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (MalformedRequest("x"), ErrorCode.MALFORMED_REQUEST),
        (UnsupportedApi("x"), ErrorCode.UNSUPPORTED_API),
        (UnsupportedVersion(Api.FETCH.name, 2, 1), ErrorCode.UNSUPPORTED_VERSION),
        (UnknownTopicOrPartition("x"), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (InvalidMessage(0, "x"), ErrorCode.INVALID_MESSAGE),
        (MessageTooLarge("message", 2, 1), ErrorCode.MESSAGE_TOO_LARGE),
        (InvalidOffset(5, 0, 38), ErrorCode.INVALID_OFFSET),
        (OffsetOutOfRange(100, 0, 38), ErrorCode.OFFSET_OUT_OF_RANGE),
        (FetchSizeTooSmall(0, 10, 38), ErrorCode.FETCH_SIZE_TOO_SMALL),
        (CorruptSegment("t-0", 0, 38, "x"), ErrorCode.CORRUPT_SEGMENT),
        (DiskFull("x"), ErrorCode.DISK_FULL),
        (StorageIOError("x"), ErrorCode.STORAGE_ERROR),
        (PartitionUnavailable("x"), ErrorCode.PARTITION_UNAVAILABLE),
        (BrokerShuttingDown("x"), ErrorCode.BROKER_SHUTTING_DOWN),
        (RegistryUnavailable("x"), ErrorCode.REGISTRY_UNAVAILABLE),
        (TopicAlreadyExists("x"), ErrorCode.TOPIC_ALREADY_EXISTS),
        (InvalidTopic("x"), ErrorCode.INVALID_TOPIC),
        (NotLeaderForPartition("t-0", 2, 6), ErrorCode.NOT_LEADER_FOR_PARTITION),
        (NotEnoughReplicas("t-0", 1, 2), ErrorCode.NOT_ENOUGH_REPLICAS),
        (FencedLeaderEpoch("t-0", 5, 6), ErrorCode.FENCED_LEADER_EPOCH),
        (UnknownLeaderEpoch("t-0", 5, 4), ErrorCode.UNKNOWN_LEADER_EPOCH),
        (NotCoordinator("g", 2, "127.0.0.1", 9093), ErrorCode.NOT_COORDINATOR),
        (CoordinatorLoading("x"), ErrorCode.COORDINATOR_LOADING),
        (UnknownMemberId("x"), ErrorCode.UNKNOWN_MEMBER_ID),
        (FencedMemberEpoch("x"), ErrorCode.FENCED_MEMBER_EPOCH),
        (UnreleasedInstanceId("x"), ErrorCode.UNRELEASED_INSTANCE_ID),
        (PartitionNotAssigned("x"), ErrorCode.PARTITION_NOT_ASSIGNED),
        (GroupNotEmptyError("x"), ErrorCode.GROUP_NOT_EMPTY),
        (UnknownGroup("x"), ErrorCode.UNKNOWN_GROUP),
        (InvalidGroup("x"), ErrorCode.INVALID_GROUP),
        (GroupHasZooKeeperMembers("x"), ErrorCode.GROUP_HAS_ZOOKEEPER_MEMBERS),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, Exception) else x.name,
)
def test_error_code_for_maps_each_error_to_its_code(error: PylogError, code: ErrorCode) -> None:
    assert error_code_for(error) is code
    assert decode_reply_header(encode_error(1, error)).error_code == code


def test_a_subclass_takes_the_code_of_its_nearest_ancestor_in_the_table() -> None:
    class QuotaExceeded(DiskFull):
        pass

    assert error_code_for(QuotaExceeded("x")) is ErrorCode.DISK_FULL


@pytest.mark.parametrize(
    "error", [ValueError("x"), OSError(5, "EIO"), KeyError("k"), PylogError("x"), StorageError()]
)
def test_errors_outside_the_table_are_unknown_server_error(error: BaseException) -> None:
    assert error_code_for(error) is ErrorCode.UNKNOWN_SERVER_ERROR


def test_a_forwarded_broker_error_keeps_its_code() -> None:
    forwarded = broker_error(ErrorCode.PARTITION_UNAVAILABLE, "worker down")
    assert error_code_for(forwarded) is ErrorCode.PARTITION_UNAVAILABLE
    assert decode_reply_header(encode_error(2, forwarded)).error_message == "worker down"
    assert error_code_for(broker_error(99, "?")) is ErrorCode.UNKNOWN_SERVER_ERROR


def test_retriable_codes_are_exactly_the_unavailable_errors() -> None:
    for entry in ERROR_TABLE:
        unavailable = entry.exception is not None and issubclass(entry.exception, Unavailable)
        assert entry.retriable == unavailable, entry.name


def test_the_error_table_has_every_code_once_in_order() -> None:
    assert [entry.code for entry in ERROR_TABLE] == list(ErrorCode)
    assert error_entry(99) is None


@pytest.mark.parametrize(
    "error",
    [
        InvalidOffset(45, 39, 78),
        FetchSizeTooSmall(0, 1, 38),
        CorruptSegment("t-0", 38, 76, "é"),
        NotCoordinator("g", 2, "127.0.0.1", 9093),
        NotCoordinator("g", -1),
    ],
    ids=lambda error: type(error).__name__,
)
def test_an_error_with_fields_round_trips_them_whatever_its_text(error: PylogError) -> None:
    """Clients act on the fields, never on the text (docs/protocol.md, "Error fields")."""
    code = error_code_for(error)
    names = ERROR_FIELDS[code].names
    with pytest.raises(BrokerError) as raised:
        decode_reply(Api.FETCH, encode_error(9, error, "x"))
    assert raised.value.message == "x"
    assert {n: getattr(raised.value, n) for n in names} == {n: getattr(error, n) for n in names}
    assert isinstance(raised.value, type(error))
    with pytest.raises(ValueError, match="carries fields"):
        encode_error(9, code, "x")


def test_an_error_reply_cut_short_in_its_fields_or_with_bytes_after_them_is_malformed() -> None:
    frame = bytes(encode_error(1, InvalidOffset(45, 39, 78))[0])
    for broken in (frame[:-1], frame + b"\x00"):
        with pytest.raises(MalformedReply, match="INVALID_OFFSET error fields"):
            decode_reply(Api.FETCH, [broken])
    plain_error = bytes(encode_error(1, ErrorCode.DISK_FULL, "full")[0])
    with pytest.raises(MalformedReply):
        decode_reply(Api.FETCH, [plain_error + b"\x00"])


def test_bytes_after_the_message_of_an_unknown_code_are_ignored() -> None:
    frame = struct.pack(">IhH", 1, 99, 1) + b"x" + b"fields of a newer broker"
    with pytest.raises(BrokerError) as raised:
        decode_reply(Api.FETCH, [frame])
    assert (raised.value.name, raised.value.message) == ("UNKNOWN_ERROR_99", "x")


def test_the_guarantees_by_ack_are_the_design_s_table() -> None:
    """protocol.md's PRODUCE and replication.md give the same guarantees table, and link each
    other."""

    def rows_of(text: str) -> list[list[str]]:
        table = text[text.index("| ack | answered when | lost if |") :].split("\n\n")[0]
        return [[cell.replace("`", "") for cell in row] for row in table_rows(table)[1:]]

    design = (DOC.parent / "replication.md").read_text()
    produce = documented_section("PRODUCE (api_key 0)")
    rows = rows_of(produce)
    assert rows == rows_of(design[design.index("## The guarantees, by ack") :])
    assert [row[0] for row in rows] == ["0 none", "1 written", "2 flushed", "3 all"]
    assert [f"{a.value} {a.name.lower()}" for a in Ack] == [row[0] for row in rows]
    assert "replication.md#the-guarantees-by-ack" in produce
    assert "protocol.md#produce-api_key-0" in design


@given(
    st.lists(
        st.tuples(st.integers(1, 2**64 - 1), u16, u32, st.integers(0, 100), st.integers(1, 100)),
        max_size=5,
    )
)
def test_a_version_5_fetch_reply_carries_its_producer_entries(
    sets: list[tuple[int, int, int, int, int]],
) -> None:
    entries, at = [], 0
    for producer_id, epoch, sequence, gap, size in sets:
        entries.append(StoredSet(producer_id, epoch, sequence, at + gap, at + gap + size, 1))
        at += gap + size
    reply = FetchReply(at, 0, b"", 3, (EpochEntry(3, 0),), 0, tuple(entries))
    frames = encode_reply(7, reply, PRODUCERS_FETCH_VERSION)
    assert decode_reply(Api.FETCH, frames, PRODUCERS_FETCH_VERSION) == reply
    if entries:  # a version 4 reply cannot carry them
        with pytest.raises(
            ValueError, match=r"FETCH version 4 has no such field \(send version 5\)"
        ):
            encode_reply(7, reply, 4)


def test_a_version_5_fetch_reply_with_overlapping_or_empty_entries_is_malformed() -> None:
    first = StoredSet(9, 0, 0, 0, 38, 1)
    for second, said in [
        (StoredSet(9, 0, 1, 20, 58, 1), "before the end 38"),
        (StoredSet(9, 0, 1, 38, 38, 1), "the range not empty"),
        (StoredSet(0, 0, 1, 38, 76, 1), "producer_id 0"),
    ]:
        reply = FetchReply(76, 0, b"", 3, (), 0, (first, second))
        frames = encode_reply(7, reply, PRODUCERS_FETCH_VERSION)
        with pytest.raises(MalformedReply, match=said):
            decode_reply(Api.FETCH, frames, PRODUCERS_FETCH_VERSION)


@given(
    high_watermark=st.integers(0, 2**64 - 1),
    log_start=st.integers(0, 2**64 - 1),
    epoch=st.integers(-1, 2**31 - 1),
    throttle_ms=st.integers(0, 2**32 - 1),
    data=st.binary(max_size=64),
    entries=st.booleans(),
)
def test_a_multi_fetch_part_packed_at_once_is_the_fetch_reply_it_stands_for(
    high_watermark: int, log_start: int, epoch: int, throttle_ms: int, data: bytes, entries: bool
) -> None:
    """protocol.fetch_part (one pack without entries) gives the bytes encode_reply gives a
    FETCH reply of version 5, and decode_fetch_part (one unpack) reads them back."""
    epochs = (protocol.EpochEntry(max(epoch, 0), 0),) if entries else ()
    reply = protocol.FetchReply(high_watermark, log_start, data, epoch, epochs, throttle_ms)
    part = protocol.fetch_part("clicks", 3, reply)
    frames = protocol.encode_reply(0, reply, protocol.PRODUCERS_FETCH_VERSION)
    assert bytes(part.reply) == bytes(protocol.fetch_part_reply("clicks", 3, frames).reply)
    decoded = protocol.decode_fetch_part(part)
    assert dataclass_values(decoded) == dataclass_values(reply)


def dataclass_values(reply: protocol.FetchReply) -> tuple[Any, ...]:
    return (
        *(getattr(reply, f.name) for f in fields(reply) if f.name != "message_set"),
        bytes(reply.message_set),
    )


@given(
    correlation_id=st.integers(1, 2**32 - 1),
    client_id=st.text(max_size=40),
    topic=st.from_regex(r"[a-z0-9._-]{1,40}", fullmatch=True),
    partition=st.integers(0, 2**32 - 1),
    ack=st.sampled_from(list(Ack)),
    producer_id=st.integers(0, 2**64 - 1),
    epoch=st.integers(0, 2**16 - 1),
    sequence=st.integers(0, 2**32 - 1),
    message_set=st.binary(max_size=64),
)
def test_a_produce_encoded_in_one_join_is_the_request_encode_request_makes(
    correlation_id: int,
    client_id: str,
    topic: str,
    partition: int,
    ack: Ack,
    producer_id: int,
    epoch: int,
    sequence: int,
    message_set: bytes,
) -> None:
    """protocol.encode_produce (the producer's path) against the table-driven encode_request."""
    request = protocol.ProduceRequest(
        topic, partition, ack, message_set, producer_id, epoch, sequence
    )
    header = protocol.RequestHeader(
        Api.PRODUCE, protocol.PRODUCE_IDEMPOTENT_VERSION, correlation_id, client_id
    )
    encoded = protocol.encode_produce(correlation_id, client_id, request)
    assert [bytes(f) for f in encoded] == [
        bytes(f) for f in protocol.encode_request(header, request)
    ]
