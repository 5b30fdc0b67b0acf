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

from broker.log.epochs import EpochEntry as EpochEntry  # the entries of a FETCH reply
from broker.log.producers import StoredSet as StoredSet  # the producers of a FETCH reply
from broker.protocol.apis import (
    API_VERSION as API_VERSION,
)
from broker.protocol.apis import (
    EARLIEST as EARLIEST,
)
from broker.protocol.apis import (
    LATEST as LATEST,
)
from broker.protocol.apis import (
    MAX_STRING_BYTES as MAX_STRING_BYTES,
)
from broker.protocol.apis import (
    MAX_TOPIC_LENGTH as MAX_TOPIC_LENGTH,
)
from broker.protocol.apis import (
    Ack as Ack,
)
from broker.protocol.apis import (
    Api as Api,
)
from broker.protocol.apis import (
    Frames as Frames,
)
from broker.protocol.codes import (
    ERROR_FIELDS as ERROR_FIELDS,
)
from broker.protocol.codes import (
    ERROR_TABLE as ERROR_TABLE,
)
from broker.protocol.codes import (
    ErrorCode as ErrorCode,
)
from broker.protocol.codes import (
    ErrorEntry as ErrorEntry,
)
from broker.protocol.codes import (
    ErrorFields as ErrorFields,
)
from broker.protocol.codes import (
    broker_error as broker_error,
)
from broker.protocol.codes import (
    error_code_for as error_code_for,
)
from broker.protocol.codes import (
    error_entry as error_entry,
)
from broker.protocol.messages import (
    AlterConfigRequest as AlterConfigRequest,
)
from broker.protocol.messages import (
    ClusterBroker as ClusterBroker,
)
from broker.protocol.messages import (
    ConfigEntry as ConfigEntry,
)
from broker.protocol.messages import (
    CreateTopicRequest as CreateTopicRequest,
)
from broker.protocol.messages import (
    DeleteTopicRequest as DeleteTopicRequest,
)
from broker.protocol.messages import (
    DescribeClusterReply as DescribeClusterReply,
)
from broker.protocol.messages import (
    DescribeClusterRequest as DescribeClusterRequest,
)
from broker.protocol.messages import (
    DescribeConfigReply as DescribeConfigReply,
)
from broker.protocol.messages import (
    DescribeConfigRequest as DescribeConfigRequest,
)
from broker.protocol.messages import (
    DescribePartitionReply as DescribePartitionReply,
)
from broker.protocol.messages import (
    DescribePartitionRequest as DescribePartitionRequest,
)
from broker.protocol.messages import (
    EmptyReply as EmptyReply,
)
from broker.protocol.messages import (
    FetchReply as FetchReply,
)
from broker.protocol.messages import (
    FetchRequest as FetchRequest,
)
from broker.protocol.messages import (
    MetadataBroker as MetadataBroker,
)
from broker.protocol.messages import (
    MetadataReply as MetadataReply,
)
from broker.protocol.messages import (
    MetadataRequest as MetadataRequest,
)
from broker.protocol.messages import (
    OffsetForLeaderEpochReply as OffsetForLeaderEpochReply,
)
from broker.protocol.messages import (
    OffsetForLeaderEpochRequest as OffsetForLeaderEpochRequest,
)
from broker.protocol.messages import (
    OffsetsReply as OffsetsReply,
)
from broker.protocol.messages import (
    OffsetsRequest as OffsetsRequest,
)
from broker.protocol.messages import (
    PartitionInfo as PartitionInfo,
)
from broker.protocol.messages import (
    ProduceReply as ProduceReply,
)
from broker.protocol.messages import (
    ProduceRequest as ProduceRequest,
)
from broker.protocol.messages import (
    Reply as Reply,
)
from broker.protocol.messages import (
    ReplyHeader as ReplyHeader,
)
from broker.protocol.messages import (
    Request as Request,
)
from broker.protocol.messages import (
    RequestHeader as RequestHeader,
)
from broker.protocol.messages import (
    Route as Route,
)
from broker.protocol.messages import (
    RoutedRequest as RoutedRequest,
)
from broker.protocol.messages import (
    TopicInfo as TopicInfo,
)
from broker.protocol.names import (
    check_topic_name as check_topic_name,
)
from broker.protocol.names import (
    settings_text as settings_text,
)
from broker.protocol.prefixes import (
    KnownPrefixes as KnownPrefixes,
)
from broker.protocol.replies import (
    decode_reply as decode_reply,
)
from broker.protocol.replies import (
    decode_reply_header as decode_reply_header,
)
from broker.protocol.replies import (
    encode_error as encode_error,
)
from broker.protocol.replies import (
    encode_reply as encode_reply,
)
from broker.protocol.requests import (
    ROUTED_APIS as ROUTED_APIS,
)
from broker.protocol.requests import (
    decode_request as decode_request,
)
from broker.protocol.requests import (
    encode_request as encode_request,
)
from broker.protocol.requests import (
    is_fire_and_forget as is_fire_and_forget,
)
from broker.protocol.requests import (
    peek_api as peek_api,
)
from broker.protocol.requests import (
    peek_api_name as peek_api_name,
)
from broker.protocol.requests import (
    peek_client_id as peek_client_id,
)
from broker.protocol.requests import (
    peek_correlation_id as peek_correlation_id,
)
from broker.protocol.tables import (
    ALTER_CONFIG as ALTER_CONFIG,
)
from broker.protocol.tables import (
    API_VERSIONS as API_VERSIONS,
)
from broker.protocol.tables import (
    CREATE_TOPIC as CREATE_TOPIC,
)
from broker.protocol.tables import (
    DELETE_TOPIC as DELETE_TOPIC,
)
from broker.protocol.tables import (
    DESCRIBE_CLUSTER as DESCRIBE_CLUSTER,
)
from broker.protocol.tables import (
    DESCRIBE_CONFIG as DESCRIBE_CONFIG,
)
from broker.protocol.tables import (
    DESCRIBE_PARTITION as DESCRIBE_PARTITION,
)
from broker.protocol.tables import (
    FETCH as FETCH,
)
from broker.protocol.tables import (
    FETCH_THROTTLE_VERSION as FETCH_THROTTLE_VERSION,
)
from broker.protocol.tables import (
    METADATA as METADATA,
)
from broker.protocol.tables import (
    METADATA_LEADERS_VERSION as METADATA_LEADERS_VERSION,
)
from broker.protocol.tables import (
    OFFSET_FOR_LEADER_EPOCH as OFFSET_FOR_LEADER_EPOCH,
)
from broker.protocol.tables import (
    OFFSETS as OFFSETS,
)
from broker.protocol.tables import (
    PRODUCE as PRODUCE,
)
from broker.protocol.tables import (
    PRODUCE_IDEMPOTENT_VERSION as PRODUCE_IDEMPOTENT_VERSION,
)
from broker.protocol.tables import (
    PRODUCE_THROTTLE_VERSION as PRODUCE_THROTTLE_VERSION,
)
from broker.protocol.tables import (
    PRODUCERS_FETCH_VERSION as PRODUCERS_FETCH_VERSION,
)
from broker.protocol.tables import (
    REPLICA_FETCH_VERSION as REPLICA_FETCH_VERSION,
)
from broker.protocol.tables import (
    SETS_FETCH_VERSION as SETS_FETCH_VERSION,
)
from broker.protocol.tables import (
    TABLES as TABLES,
)
from broker.protocol.tables import (
    ApiTable as ApiTable,
)
from broker.protocol.tables import (
    request_version as request_version,
)
