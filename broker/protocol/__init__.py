"""The wire protocol of the pylog broker: frames in, values out, and back. No sockets here.

The package's modules: tables (one table per api: its versions, its request and reply bodies
field by field, its errors, the checks its values pass), schema (the tables' language, and
the encoders and readers generated from them), messages (every request and reply as a value),
requests and replies (their frames, both ways, through the tables), codes (error codes,
ERROR_TABLE), apis (the api keys), names (topic names), wire (fields and the frame reader),
prefixes (KnownPrefixes, the hot path's shortcut past decoding a routed request's header).
Import from the package.

A request is one ZeroMQ frame and a reply one or two. The routing envelope (the ROUTER's
identity frame, and the empty delimiter a REQ socket adds and strips by itself; a DEALER client
sends none) is the transport's business: the functions here take and return the frames after
it, so item 0 of a frame list is "frame 1" of docs/protocol.md:

    request   frame 1  header       api_key u16, api_version u16, correlation_id u32,
                                    client_id string
                       body         right after client_id: fixed per api and api_version
                                    (the api's table in broker.protocol.tables; API_VERSIONS)
                       message set  PRODUCE only: the rest of the frame, messages back to
                                    back (broker.log.message); no length field
    reply     frame 1  header       correlation_id u32, error_code i16, error_message string
                       body         right after error_message, fixed per api; absent when
                                    error_code is not 0
                       error fields the codes of ERROR_FIELDS only (INVALID_OFFSET,
                                    NOT_LEADER_FOR_PARTITION, ...), right after error_message:
                                    the values a client acts on; no text is parsed
              frame 2  message set  FETCH success only: whole messages from the fetch offset

All integers are big-endian; a string is a u16 byte length and that many bytes of UTF-8. A
frame that ends inside a field, or has bytes left over after the body's last field (for a
PRODUCE request there are none: the message set runs to the end), is malformed; error messages
name the part ("request header", "FETCH body", "reply header", ...), the field and its byte
position counted from the start of the frame. docs/protocol.md is the full description, with
test vectors that tests/protocol checks against this package, and field tables that
tests/protocol/test_tables.py checks against the api tables.

Message sets are copied at most once: a PRODUCE request's is joined into its one frame by
encode_request (and read back by decode_request as a memoryview over that frame's tail), a
FETCH reply's is put into the frame list by encode_reply as the very object given (a view of a
segment is sent without copying) and read back by decode_reply as a memoryview over frame 2.
Decoders take any buffer as a frame (bytes, memoryview, and at run time a zmq.Frame too).
Decoding a request checks every field's framing and range and every topic name, but not the
message set, which is the partition log's job (broker.log.message.validate_message_set), nor
topic settings, which are broker.config's.

Every error has a wire code in one table, ERROR_TABLE: code, exception class, retriable.

Versions: a request's header says its api_version, and decode_request reads the body of that
version; a reply does not say it, so encode_reply and decode_reply take the version of the
request it answers (1 by default). The dataclasses hold the fields of every version, the newer
ones with defaults that mean "not said" (FetchRequest.replica_id -1, ...), so that code written
for version 1 builds and reads them unchanged. Encoding a request at version 1 with a newer
field set is a ValueError (a replica's FETCH must not go out as a consumer's); encoding a reply
at version 1 leaves the newer fields out (the asker did not ask for them).
"""

from __future__ import annotations

from broker.log.epochs import (
    EpochEntry,
)
from broker.log.producers import (
    StoredSet,
)
from broker.protocol.apis import (
    API_VERSION,
    CREATE_WAIT_S,
    EARLIEST,
    LATEST,
    MAX_STRING_BYTES,
    MAX_TOPIC_LENGTH,
    Ack,
    Api,
    Frames,
)
from broker.protocol.codes import (
    ERROR_FIELDS,
    ERROR_TABLE,
    ErrorCode,
    ErrorEntry,
    ErrorFields,
    broker_error,
    error_code_for,
    error_entry,
)
from broker.protocol.messages import (
    AlterConfigRequest,
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
    FetchPart,
    FetchPartReply,
    FetchReply,
    FetchRequest,
    GroupHeartbeatReply,
    GroupHeartbeatRequest,
    GroupListing,
    GroupMemberInfo,
    GroupPartitions,
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
    RoutedRequest,
    SegmentState,
    SessionPartition,
    TopicInfo,
    partition_list,
)
from broker.protocol.names import (
    check_topic_name,
    settings_text,
)
from broker.protocol.prefixes import (
    KnownPrefixes,
)
from broker.protocol.replies import (
    decode_fetch_part,
    decode_part_reply,
    decode_reply,
    decode_reply_header,
    encode_error,
    encode_reply,
    fetch_part,
    fetch_part_reply,
    part_reply,
)
from broker.protocol.requests import (
    ROUTED_APIS,
    decode_request,
    encode_produce,
    encode_request,
    is_fire_and_forget,
    peek_api,
    peek_api_name,
    peek_client_id,
    peek_correlation_id,
)
from broker.protocol.tables import (
    API_VERSIONS,
    DESCRIBE_PARTITION_RETENTION_VERSION,
    FETCH_THROTTLE_VERSION,
    MAX_PARTS,
    METADATA_LEADERS_VERSION,
    MIN_MEMBER_EPOCH,
    PRODUCE_IDEMPOTENT_VERSION,
    PRODUCE_THROTTLE_VERSION,
    PRODUCERS_FETCH_VERSION,
    REPLICA_FETCH_VERSION,
    SESSIONLESS,
    SETS_FETCH_VERSION,
    TABLES,
    ApiTable,
    request_version,
)

__all__ = [
    "API_VERSION",
    "API_VERSIONS",
    "CREATE_WAIT_S",
    "DESCRIBE_PARTITION_RETENTION_VERSION",
    "EARLIEST",
    "ERROR_FIELDS",
    "ERROR_TABLE",
    "FETCH_THROTTLE_VERSION",
    "LATEST",
    "MAX_PARTS",
    "MAX_STRING_BYTES",
    "MAX_TOPIC_LENGTH",
    "METADATA_LEADERS_VERSION",
    "MIN_MEMBER_EPOCH",
    "PRODUCERS_FETCH_VERSION",
    "PRODUCE_IDEMPOTENT_VERSION",
    "PRODUCE_THROTTLE_VERSION",
    "REPLICA_FETCH_VERSION",
    "ROUTED_APIS",
    "SESSIONLESS",
    "SETS_FETCH_VERSION",
    "TABLES",
    "Ack",
    "AlterConfigRequest",
    "Api",
    "ApiTable",
    "ClusterBroker",
    "CommitPart",
    "CommitPartReply",
    "CommittedOffset",
    "CommittedTopic",
    "ConfigEntry",
    "CreatePartitionsRequest",
    "CreateTopicRequest",
    "DeleteGroupRequest",
    "DeleteTopicRequest",
    "DescribeClusterReply",
    "DescribeClusterRequest",
    "DescribeConfigReply",
    "DescribeConfigRequest",
    "DescribeGroupReply",
    "DescribeGroupRequest",
    "DescribePartitionReply",
    "DescribePartitionRequest",
    "EmptyReply",
    "EpochEntry",
    "ErrorCode",
    "ErrorEntry",
    "ErrorFields",
    "FetchPart",
    "FetchPartReply",
    "FetchReply",
    "FetchRequest",
    "Frames",
    "GroupHeartbeatReply",
    "GroupHeartbeatRequest",
    "GroupListing",
    "GroupMemberInfo",
    "GroupPartitions",
    "KnownPrefixes",
    "ListGroupsReply",
    "ListGroupsRequest",
    "MetadataBroker",
    "MetadataReply",
    "MetadataRequest",
    "MultiFetchReply",
    "MultiFetchRequest",
    "MultiProduceReply",
    "MultiProduceRequest",
    "OffsetCommitReply",
    "OffsetCommitRequest",
    "OffsetFetchReply",
    "OffsetFetchRequest",
    "OffsetForLeaderEpochReply",
    "OffsetForLeaderEpochRequest",
    "OffsetsReply",
    "OffsetsRequest",
    "PartReply",
    "PartitionInfo",
    "ProducePart",
    "ProduceReply",
    "ProduceRequest",
    "Reply",
    "ReplyHeader",
    "Request",
    "RequestHeader",
    "Route",
    "RoutedRequest",
    "SegmentState",
    "SessionPartition",
    "StoredSet",
    "TopicInfo",
    "broker_error",
    "check_topic_name",
    "decode_fetch_part",
    "decode_part_reply",
    "decode_reply",
    "decode_reply_header",
    "decode_request",
    "encode_error",
    "encode_produce",
    "encode_reply",
    "encode_request",
    "error_code_for",
    "error_entry",
    "fetch_part",
    "fetch_part_reply",
    "is_fire_and_forget",
    "part_reply",
    "partition_list",
    "peek_api",
    "peek_api_name",
    "peek_client_id",
    "peek_correlation_id",
    "request_version",
    "settings_text",
]
