"""The one error tree of pylog.

    PylogError                      root: catch this to catch anything pylog raises on purpose
    └── StorageError                a partition log refused an operation; the log is unchanged
        ├── InvalidMessage          an incoming message set failed framing or checksum checks
        ├── MessageTooLarge         a message is over max.message.bytes, or a set over segment.bytes
        ├── InvalidOffset           an offset inside [log start, high watermark] that is not
        │                           where a message starts
        ├── OffsetOutOfRange        an offset outside [log start, high watermark]
        ├── FetchSizeTooSmall       the first message at an offset is larger than max_bytes
        ├── CorruptSegment          bytes already stored fail framing or checksum on read
        ├── DiskFull                the file system said ENOSPC / EDQUOT / EFBIG (append, flush,
        │                           roll, creating a partition)
        └── StorageIOError          any other OS error while touching a segment (EIO, EMFILE...),
                                    and anything asked of a log whose fsync failed
    ├── RequestError                a request the broker refuses as asked; nothing changed
    │   ├── MalformedRequest        frames missing, too short, or fields out of their range
    │   ├── UnsupportedApi          an api key this broker does not speak
    │   │   └── UnsupportedVersion  a known api key with an api version it does not speak
    │   ├── UnknownTopicOrPartition the topic, or that partition of it, does not exist here
    │   ├── TopicAlreadyExists      create of a topic that exists
    │   ├── InvalidTopic            a topic name or topic setting that is not allowed
    │   ├── AuthorizationFailed     no ACL grants the connection's principal the operation
    │   ├── FencedLeaderEpoch       a replica's leader epoch is older than the leader's
    │   ├── UnsupportedFormat       a FETCH of a version that cannot read what lies at its
    │   │                           offset (a compressed set, headers): the client is to be
    │   │                           upgraded
    │   ├── DuplicateSequence       an idempotent producer's set stored already, whose offset
    │   │                           is no longer known (its segment was deleted)
    │   ├── InvalidProducerEpoch    an idempotent producer's epoch older than the partition's
    │   ├── UnknownMemberId         no such member of the consumer group (removed, or never
    │   │                           joined): it gives up its partitions and joins again
    │   ├── FencedMemberEpoch       a member epoch, or partitions owned, the member does not hold
    │   ├── PartitionNotAssigned    an OFFSET_COMMIT part for a partition not the member's at
    │   │                           that epoch (a zombie's)
    │   ├── GroupNotEmptyError      a commit without a member, or a delete, while the group has
    │   │                           members
    │   ├── UnknownGroup            no such consumer group
    │   └── InvalidGroup            a group name, member id, instance id, timeout, assignor or
    │                               subscription that is not allowed
    ├── Unavailable                 retriable: the same request may succeed later
    │   ├── PartitionUnavailable    the worker owning the partition is down or restarting
    │   ├── BrokerShuttingDown      the broker is stopping and accepts no new requests
    │   ├── RegistryUnavailable     ZooKeeper cannot be reached or the session is lost
    │   ├── NotLeaderForPartition   this broker does not lead the partition (now)
    │   ├── NotEnoughReplicas       ack=all, and the in-sync replicas are too few
    │   ├── UnknownLeaderEpoch      the asker's leader epoch is newer than this broker's
    │   ├── OutOfOrderSequence      an idempotent producer's set arrived before one it follows
    │   ├── RepliesNotRead          the connection does not take its replies: one not kept
    │   ├── NotCoordinator          this broker does not coordinate the consumer group (now)
    │   ├── CoordinatorLoading      it does, and is claiming or loading the group
    │   ├── UnreleasedInstanceId    a static member's instance id held by a member not gone
    │   ├── GroupHasZooKeeperMembers
    │   │                           members of the paper's (ZooKeeper) protocol are in the group
    │   └── ConnectionRefused       client side: nothing listens at the broker's address
    ├── BrokerError                 client side: the broker answered with an error code
    │   ├── UnknownServerError      UNKNOWN_SERVER_ERROR
    │   └── Broker<Class>           every other code: BrokerTopicAlreadyExists is a
    │                               BrokerError and a TopicAlreadyExists (the class above
    │                               that the broker raised), and so on down the table
    ├── MalformedReply              client side: a reply that does not follow the protocol
    ├── AuthenticationFailed        client side: the Curve handshake with a broker failed
    ├── RegistryAccessDenied        a ZooKeeper ACL refused a change to a registry node
    └── ZooKeeperStartError         the private ZooKeeper could not be started

InvalidMessage and MessageTooLarge are about what a producer sent; CorruptSegment is about what
is already on disk. InvalidOffset and OffsetOutOfRange are both about a requested offset: the
first is in range but lands inside a message, the second is outside the readable range.
RequestError is a request that will fail the same way every time; Unavailable is one that may
succeed when retried. The broker answers every one of these with its wire error code
(broker.protocol holds the one table); a client raises that code's BrokerError subclass
(broker.protocol.broker_error), so `except TopicAlreadyExists` and `except Unavailable` catch
what a broker answered as they catch what this process raised, and `except BrokerError` catches
any answered error. A client-side one carries the code, name, message and retriable of
BrokerError and, for the codes whose replies carry fields (docs/protocol.md, "Error fields"),
those fields as the broker-side attributes of the same name: an answered InvalidOffset has
`message_start` and `next_offset`, FetchSizeTooSmall `needed`, CorruptSegment `start`, `end`
and `reason`, AuthorizationFailed `operation` and `resource`, NotLeaderForPartition `leader`
and `leader_epoch`, NotEnoughReplicas `isr_size` and `min_insync_replicas`, FencedLeaderEpoch
and UnknownLeaderEpoch `leader_epoch`, NotCoordinator `coordinator`, `host` and `port`. The
attributes the request holds (the offset, max_bytes, the partition, the epoch asked with, the
group) are not repeated in the reply, and an answered error has none of them.

Which replication errors are retriable: NOT_LEADER_FOR_PARTITION is (leadership moves to a
broker the client finds by METADATA, or comes back: the request itself is good),
NOT_ENOUGH_REPLICAS is (the in-sync set grows back as followers catch up), UNKNOWN_LEADER_EPOCH
is (the asker learnt of a new epoch before this broker did, which learns it within moments);
FENCED_LEADER_EPOCH is not: the request carries an epoch that will never be current again, and
only a new request, after the replica has caught up with the registry (and truncated), can
succeed.
"""

from __future__ import annotations


class PylogError(Exception):
    """Root of every error pylog raises on purpose."""


class StorageError(PylogError):
    """A partition log refused an operation. The log is exactly as it was before the call,
    but after a failed fsync, which fails the log until it is reopened (LocalLog.flush)."""


class InvalidMessage(StorageError):
    """A message set failed validation. `position` is the byte position, within the set, of the
    first bad message; `reason` says what was wrong with it. Nothing of the set was appended."""

    def __init__(self, position: int, reason: str) -> None:
        super().__init__(f"invalid message at byte {position} of the message set: {reason}")
        self.position = position
        self.reason = reason


class MessageTooLarge(StorageError):
    """A message larger than max.message.bytes, or a message set larger than segment.bytes."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} of {size} bytes is over the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class InvalidOffset(StorageError):
    """The offset is within the readable range but is not the first byte of a message."""

    def __init__(self, offset: int, message_start: int, next_offset: int) -> None:
        super().__init__(
            f"offset {offset} is not a message boundary: the message around it starts at "
            f"{message_start} and the next one at {next_offset}"
        )
        self.offset = offset
        self.message_start = message_start
        self.next_offset = next_offset


class OffsetOutOfRange(StorageError):
    """The offset is before the log start or after the high watermark."""

    def __init__(self, offset: int, log_start: int, high_watermark: int) -> None:
        super().__init__(
            f"offset {offset} is out of range: readable offsets are [{log_start}, {high_watermark}]"
        )
        self.offset = offset
        self.log_start = log_start
        self.high_watermark = high_watermark


class FetchSizeTooSmall(StorageError):
    """The first message at the offset does not fit in max_bytes; `needed` is its size."""

    def __init__(self, offset: int, max_bytes: int, needed: int) -> None:
        super().__init__(
            f"the message at offset {offset} is {needed} bytes, larger than max_bytes "
            f"{max_bytes}: fetch with max_bytes >= {needed}"
        )
        self.offset = offset
        self.max_bytes = max_bytes
        self.needed = needed


class CorruptSegment(StorageError):
    """Bytes already stored fail framing or checksum checks: offsets [start, end) of partition
    `partition` (`<topic>-<number>`) are damaged, and a reader skips them by reading on from
    `end`, a message boundary; `reason` says why, for people."""

    def __init__(self, partition: str, start: int, end: int, reason: str) -> None:
        super().__init__(
            f"partition {partition}: offsets [{start}, {end}) are damaged ({reason}); "
            f"fetch from offset {end} to skip them"
        )
        self.partition = partition
        self.start = start
        self.end = end
        self.reason = reason


class DiskFull(StorageError):
    """The file system has no room (ENOSPC, EDQUOT) or refused the file size (EFBIG)."""


class StorageIOError(StorageError):
    """Any other operating-system error while reading or writing a segment."""


DISK_ERRORS = (DiskFull, StorageIOError)
"""What the disk or the file table says (not what a request got wrong)."""


class RequestError(PylogError):
    """The broker refuses the request as it was asked; retrying it unchanged fails the same way."""


class MalformedRequest(RequestError):
    """A request's frames are missing, too short or too long, or a field is out of its range."""


class UnsupportedApi(RequestError):
    """The request names an api key, or a version of one, that this broker does not speak."""


class UnsupportedVersion(UnsupportedApi):
    """The api key is one this broker speaks, the api version is not (UNSUPPORTED_VERSION).
    An UnsupportedApi, so code that catches that still catches this."""

    def __init__(self, api_name: str, version: int, supported: int | tuple[int, ...]) -> None:
        versions = (supported,) if isinstance(supported, int) else supported
        spoken = (
            f"version {versions[0]}"
            if len(versions) == 1
            else f"versions {', '.join(map(str, versions[:-1]))} and {versions[-1]}"
        )
        super().__init__(
            f"{api_name} version {version} is not supported: this broker speaks {api_name} {spoken}"
        )
        self.api_name = api_name
        self.version = version


class UnknownTopicOrPartition(RequestError):
    """The topic does not exist, or has no partition with that number on this broker."""


class TopicAlreadyExists(RequestError):
    """A topic of that name exists already."""


class InvalidTopic(RequestError):
    """A topic name or a topic setting is not allowed (the message says which and why)."""


class AuthorizationFailed(RequestError):
    """The connection's principal may not do `operation` on `resource` (a topic): no ACL
    grants it (docs/security.md); or (`message`, the others empty) the connection's key is no
    principal's any more."""

    def __init__(
        self, principal: str, operation: str, resource: str, message: str | None = None
    ) -> None:
        super().__init__(
            message
            or f"principal {principal!r} may not {operation} topic {resource!r}: no ACL grants "
            f"it (pylogctl acl add --principal {principal} --operation {operation} "
            f"--topic {resource})"
        )
        self.principal = principal
        self.operation = operation
        self.resource = resource


class UnsupportedFormat(RequestError):
    """A FETCH of version 1 or 2 reached a compressed set or a message with headers (format 2)
    in partition `partition` (`<topic>-<number>`), at offset `offset`: those versions cannot
    read one, and are served each segment only up to its first (docs/protocol.md, FETCH)."""

    def __init__(self, partition: str, offset: int) -> None:
        super().__init__(
            f"partition {partition}: the data from offset {offset} on in its segment holds "
            "compressed sets or messages with headers, which this FETCH version cannot read: "
            "upgrade the client to one that sends FETCH version 3"
        )
        self.partition = partition
        self.offset = offset


class FencedLeaderEpoch(RequestError):
    """A replica asked with leader epoch `asked`, older than this leader's, `leader_epoch`: its
    view of partition `partition` (`<topic>-<number>`) is stale. Not retriable as sent: the
    replica waits for the partition's state node to show the new epoch, truncates, and asks
    again with it."""

    def __init__(self, partition: str, asked: int, leader_epoch: int) -> None:
        super().__init__(
            f"partition {partition}: leader epoch {asked} is fenced: the leader's epoch is "
            f"{leader_epoch}"
        )
        self.partition = partition
        self.asked = asked
        self.leader_epoch = leader_epoch


class DuplicateSequence(RequestError):
    """A set of idempotent producer `producer_id` (epoch `epoch`) with sequence `sequence`
    that partition `partition` (`<topic>-<number>`) stored already, but whose offset it no
    longer knows: the segment that held the set, and its producer entries, were deleted
    (retention). The set is stored once; sending it again gets the same answer."""

    def __init__(self, partition: str, producer_id: int, epoch: int, sequence: int) -> None:
        super().__init__(
            f"partition {partition}: the set of sequence {sequence} of producer {producer_id} "
            f"(epoch {epoch}) was stored already (not again); its offset is no longer known"
        )
        self.partition = partition
        self.producer_id = producer_id
        self.epoch = epoch
        self.sequence = sequence


class InvalidProducerEpoch(RequestError):
    """A set of idempotent producer `producer_id` with epoch `epoch`, older than
    `current_epoch`, the newest the partition `partition` (`<topic>-<number>`) has stored for
    that producer id: another producer took the id over (fenced). Not retriable."""

    def __init__(self, partition: str, producer_id: int, epoch: int, current_epoch: int) -> None:
        super().__init__(
            f"partition {partition}: producer {producer_id} is fenced: its epoch {epoch} is "
            f"older than the partition's {current_epoch} for that producer id"
        )
        self.partition = partition
        self.producer_id = producer_id
        self.epoch = epoch
        self.current_epoch = current_epoch


class UnknownProducerId(RequestError):
    """A set of idempotent producer `producer_id` (epoch `epoch`) with sequence `sequence`,
    not 0, while partition `partition` (`<topic>-<number>`) knows no set of that producer id:
    it never stored one, or it forgot the producer (emptied, or made room for others after
    the producer was idle PROTECTED_S, broker.log.producers). Nothing was appended. Not
    retriable as sent: a set never sent before goes again under a new producer id; a set sent
    before may have been stored by that sending (its reply lost), so sending it again could
    store it twice: the client fails it instead (docs/protocol.md, PRODUCE version 3)."""

    def __init__(self, partition: str, producer_id: int, epoch: int, sequence: int) -> None:
        super().__init__(
            f"partition {partition} knows no set of producer {producer_id} (epoch {epoch}): "
            f"its set of sequence {sequence} was not stored (a new producer starts at 0; one "
            "the partition forgot starts again under a new id)"
        )
        self.partition = partition
        self.producer_id = producer_id
        self.epoch = epoch
        self.sequence = sequence


class FetchSessionIdNotFound(RequestError):
    """A MULTI_FETCH went on with a fetch session this broker does not hold: it never gave that
    id, or forgot it (the worker holding it restarted; the session went unused too long, or
    made room for newer ones), or a partition the fetch names lies in another of its workers.
    Not retriable as sent: start a new session (session_id 0, session_epoch 0, every
    partition)."""


class InvalidFetchSessionEpoch(RequestError):
    """A MULTI_FETCH of a fetch session whose session_epoch is not the one after the last the
    session served (a fetch sent twice, or one lost on its way). Not retriable as sent: start
    a new session."""


class UnknownMemberId(RequestError):
    """A consumer group has no member of that id (docs/protocol.md, GROUP_HEARTBEAT): it was
    removed (its session ran out, it passed its revocation deadline, it left) or never joined.
    Not retriable as sent: the member gives up every partition, without committing, and joins
    again with member epoch 0."""


class FencedMemberEpoch(RequestError):
    """A member sent an epoch it does not hold (a zombie's, or one older than the reply it
    lost), or reported owning partitions it was not given. As UnknownMemberId: the member gives
    up every partition, without committing, and joins again with member epoch 0."""


class PartitionNotAssigned(RequestError):
    """An OFFSET_COMMIT part for a partition that is not the member's at the epoch it commits
    with: a zombie's commit, or one for a partition reassigned since. The part is refused; the
    offset stays as it was."""


class GroupNotEmptyError(RequestError):
    """A commit without a member, or a DELETE_GROUP, while the group has members (the message
    names them). (broker.registry.groups has a GroupNotEmpty of its own, for the paper's
    groups.)"""


class UnknownGroup(RequestError):
    """No such consumer group (DESCRIBE_GROUP, DELETE_GROUP)."""


class InvalidGroup(RequestError):
    """A group name, member id, instance id, timeout, assignor or subscription that is not
    allowed (the message says which and why)."""


class Unavailable(PylogError):
    """The request could not be served now but may succeed when retried."""


class PartitionUnavailable(Unavailable):
    """The worker that owns the partition is down or being restarted."""


class BrokerShuttingDown(Unavailable):
    """The broker is stopping and takes no new requests."""


class RegistryUnavailable(Unavailable):
    """ZooKeeper cannot be reached, or the session was lost and is not yet back."""


class NotLeaderForPartition(Unavailable):
    """This broker holds partition `partition` (`<topic>-<number>`) but does not lead it, or
    stopped leading it while the request waited (an ack=all PRODUCE; the set may have been
    kept). `leader` is the leader as far as this broker knows, -1 for none known, and
    `leader_epoch` the epoch of that knowledge (-1 for none). Retriable: ask METADATA again
    and send the request to the leader."""

    def __init__(self, partition: str, leader: int, leader_epoch: int) -> None:
        where = "no leader is known" if leader < 0 else f"its leader is broker {leader}"
        super().__init__(
            f"partition {partition}: this broker is not its leader: {where} (leader epoch "
            f"{leader_epoch})"
        )
        self.partition = partition
        self.leader = leader
        self.leader_epoch = leader_epoch


class NotEnoughReplicas(Unavailable):
    """An ack=all PRODUCE to partition `partition` (`<topic>-<number>`) while its in-sync set
    holds `isr_size` replicas, fewer than the topic's `min_insync_replicas`: refused before
    anything was appended, or, the set shrinking while the request waited, answered so with
    the set possibly kept (at least once). Retriable: followers that catch up rejoin."""

    def __init__(self, partition: str, isr_size: int, min_insync_replicas: int) -> None:
        super().__init__(
            f"partition {partition}: {isr_size} in-sync replica{'' if isr_size == 1 else 's'}, "
            f"fewer than min_insync_replicas {min_insync_replicas}: ack=all is refused"
        )
        self.partition = partition
        self.isr_size = isr_size
        self.min_insync_replicas = min_insync_replicas


class UnknownLeaderEpoch(Unavailable):
    """The asker's leader epoch `asked` for partition `partition` (`<topic>-<number>`) is
    newer than this broker's, `leader_epoch`: the controller chose a leader this broker has
    not heard of yet. Retriable: this broker learns it from its watch within moments."""

    def __init__(self, partition: str, asked: int, leader_epoch: int) -> None:
        super().__init__(
            f"partition {partition}: leader epoch {asked} is not known here yet: this broker "
            f"is at epoch {leader_epoch}"
        )
        self.partition = partition
        self.asked = asked
        self.leader_epoch = leader_epoch


class OutOfOrderSequence(Unavailable):
    """A set of idempotent producer `producer_id` (epoch `epoch`) with sequence `sequence`
    while partition `partition` (`<topic>-<number>`) expects `expected` next from it: a set
    before it has not arrived (it failed, or is still on its way). Nothing was appended.
    Retriable: the client sends its sets again in order, the missing one first."""

    def __init__(
        self, partition: str, producer_id: int, epoch: int, sequence: int, expected: int
    ) -> None:
        super().__init__(
            f"partition {partition}: the set of sequence {sequence} of producer {producer_id} "
            f"(epoch {epoch}) is out of order: sequence {expected} is expected next"
        )
        self.partition = partition
        self.producer_id = producer_id
        self.epoch = epoch
        self.sequence = sequence
        self.expected = expected


class TooManyProducers(Unavailable):
    """A new idempotent producer's first set while partition `partition` (`<topic>-<number>`)
    remembers `limit` producers, the least recently active of them within `protected_s`: none
    is forgotten to make room (it might still send its last set again, which would then be
    stored twice). Or, with `client` (a client id) holding `held` of them, while the
    partition's last `reserved` places are kept for client ids holding fewer: that client's
    least recently active producer was active within `protected_s`. Nothing was appended.
    Retriable: room comes as producers fall idle."""

    def __init__(
        self,
        partition: str,
        limit: int,
        protected_s: float,
        client: str | None = None,
        held: int = 0,
        reserved: int = 0,
    ) -> None:
        if client is None:
            message = (
                f"partition {partition} remembers {limit} idempotent producers, each active in "
                f"the last {protected_s:g} s: a new one is refused until one has been idle "
                "that long"
            )
        else:
            message = (
                f"partition {partition} remembers {limit} idempotent producers, {held} of them "
                f"of client id {client[:255]!r}, each of those active in the last "
                f"{protected_s:g} s: a new one of that client id is refused until one of its "
                f"own has been idle that long (the last {reserved} places are kept for client "
                "ids that hold fewer)"
            )
        super().__init__(message)
        self.partition = partition


class RepliesNotRead(Unavailable):
    """The connection holds as many bytes of replies it has not taken as the broker keeps for
    one connection (or any, while the broker holds its ceiling for all), and this request
    could not wait, or this reply was not kept (broker.replies). Retriable: read the replies,
    then send the request again."""


class ConnectionRefused(Unavailable):
    """Client side: a connection to the broker at `endpoint` was refused (nothing listens
    there: the broker is down, or the address names another port), known at once from the
    socket's monitor rather than after the request's timeout. Retriable, as elsewhere: a
    client given several brokers asks the next at once, and a call to a partition's leader
    tries again within its time (a leader that died refuses until the controller names
    another); one connection's `call` raises it at once, nothing being there to wait for."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(
            f"connection refused: nothing listens at {endpoint} (is the broker down, or is "
            "that another port?)"
        )
        self.endpoint = endpoint


class NotCoordinator(Unavailable):
    """This broker does not coordinate consumer group `group`: `coordinator` is the broker it
    computes as the group's coordinator (-1 when it knows none), which listens at `host` and
    `port` ("" and 0 when none). Retriable: send the group's requests there (docs/protocol.md,
    "Consumer groups")."""

    def __init__(self, group: str, coordinator: int, host: str = "", port: int = 0) -> None:
        where = (
            "no coordinator is known"
            if coordinator < 0
            else f"broker {coordinator} at {host}:{port} does"
        )
        super().__init__(f"group {group}: this broker does not coordinate it: {where}")
        self.group = group
        self.coordinator = coordinator
        self.host = host
        self.port = port


class CoordinatorLoading(Unavailable):
    """This broker coordinates the consumer group but is claiming or loading it, or waits for
    the previous holder's claim to end. Retriable: it answers within moments."""


class UnreleasedInstanceId(Unavailable):
    """A static member joined with an instance id that belongs to a member that has not left.
    Retriable: it is released when that member leaves or its session ends."""


class GroupHasZooKeeperMembers(Unavailable):
    """Members of the paper's protocol (ZooKeeper members, registered under the group's `ids`)
    are in the group: the brokers coordinate it only once they are gone. Retriable: stop them
    first."""


class RegistryAccessDenied(PylogError):
    """ZooKeeper refused a change to a registry node (NoAuth): an ACL on the path does not let
    this session's identity (its `auth`, or none) make it. Nothing changed; the same identity
    is refused again. The message names the request, the path and the identity."""


class BrokerError(PylogError):
    """Client side: the broker answered a request with an error code.

    `code` is the wire error code (broker.protocol.ErrorCode), `name` its name, `message` the
    broker's text and `retriable` whether the same request may succeed later. A known code is
    raised as its own subclass below (broker.protocol.broker_error); BrokerError itself only
    for a code from a newer broker."""

    def __init__(self, code: int, name: str, message: str, retriable: bool) -> None:
        # Exception's own __init__, not the next in the MRO: a subclass below is also a
        # broker-side class whose __init__ takes other arguments (InvalidOffset's offsets).
        Exception.__init__(self, f"{name}: {message}" if message else name)
        self.code = code
        self.name = name
        self.message = message
        self.retriable = retriable


class UnknownServerError(BrokerError):
    """UNKNOWN_SERVER_ERROR: the broker failed in a way it has no code for."""


class BrokerMalformedRequest(BrokerError, MalformedRequest):
    """A broker answered MALFORMED_REQUEST."""


class BrokerUnsupportedApi(BrokerError, UnsupportedApi):
    """A broker answered UNSUPPORTED_API."""


class BrokerUnsupportedVersion(BrokerError, UnsupportedVersion):
    """A broker answered UNSUPPORTED_VERSION."""


class BrokerUnknownTopicOrPartition(BrokerError, UnknownTopicOrPartition):
    """A broker answered UNKNOWN_TOPIC_OR_PARTITION."""


class BrokerInvalidMessage(BrokerError, InvalidMessage):
    """A broker answered INVALID_MESSAGE."""


class BrokerMessageTooLarge(BrokerError, MessageTooLarge):
    """A broker answered MESSAGE_TOO_LARGE."""


class BrokerInvalidOffset(BrokerError, InvalidOffset):
    """A broker answered INVALID_OFFSET."""


class BrokerOffsetOutOfRange(BrokerError, OffsetOutOfRange):
    """A broker answered OFFSET_OUT_OF_RANGE."""


class BrokerFetchSizeTooSmall(BrokerError, FetchSizeTooSmall):
    """A broker answered FETCH_SIZE_TOO_SMALL."""


class BrokerCorruptSegment(BrokerError, CorruptSegment):
    """A broker answered CORRUPT_SEGMENT."""


class BrokerDiskFull(BrokerError, DiskFull):
    """A broker answered DISK_FULL."""


class BrokerStorageIOError(BrokerError, StorageIOError):
    """A broker answered STORAGE_ERROR."""


class BrokerPartitionUnavailable(BrokerError, PartitionUnavailable):
    """A broker answered PARTITION_UNAVAILABLE."""


class BrokerShuttingDownError(BrokerError, BrokerShuttingDown):
    """A broker answered BROKER_SHUTTING_DOWN."""


class BrokerRegistryUnavailable(BrokerError, RegistryUnavailable):
    """A broker answered REGISTRY_UNAVAILABLE."""


class BrokerTopicAlreadyExists(BrokerError, TopicAlreadyExists):
    """A broker answered TOPIC_ALREADY_EXISTS."""


class BrokerInvalidTopic(BrokerError, InvalidTopic):
    """A broker answered INVALID_TOPIC."""


class BrokerAuthorizationFailed(BrokerError, AuthorizationFailed):
    """A broker answered AUTHORIZATION_FAILED."""


class BrokerRegistryAccessDenied(BrokerError, RegistryAccessDenied):
    """A broker answered REGISTRY_ACCESS_DENIED."""


class BrokerNotLeaderForPartition(BrokerError, NotLeaderForPartition):
    """A broker answered NOT_LEADER_FOR_PARTITION."""


class BrokerNotEnoughReplicas(BrokerError, NotEnoughReplicas):
    """A broker answered NOT_ENOUGH_REPLICAS."""


class BrokerFencedLeaderEpoch(BrokerError, FencedLeaderEpoch):
    """A broker answered FENCED_LEADER_EPOCH."""


class BrokerUnknownLeaderEpoch(BrokerError, UnknownLeaderEpoch):
    """A broker answered UNKNOWN_LEADER_EPOCH."""


class BrokerRepliesNotRead(BrokerError, RepliesNotRead):
    """A broker answered REPLIES_NOT_READ."""


class BrokerUnsupportedFormat(BrokerError, UnsupportedFormat):
    """A broker answered UNSUPPORTED_FORMAT."""


class BrokerOutOfOrderSequence(BrokerError, OutOfOrderSequence):
    """A broker answered OUT_OF_ORDER_SEQUENCE."""


class BrokerDuplicateSequence(BrokerError, DuplicateSequence):
    """A broker answered DUPLICATE_SEQUENCE."""


class BrokerFetchSessionIdNotFound(BrokerError, FetchSessionIdNotFound):
    """A broker answered FETCH_SESSION_ID_NOT_FOUND."""


class BrokerInvalidFetchSessionEpoch(BrokerError, InvalidFetchSessionEpoch):
    """A broker answered INVALID_FETCH_SESSION_EPOCH."""


class BrokerUnknownProducerId(BrokerError, UnknownProducerId):
    """A broker answered UNKNOWN_PRODUCER_ID."""


class BrokerTooManyProducers(BrokerError, TooManyProducers):
    """A broker answered TOO_MANY_PRODUCERS."""


class BrokerInvalidProducerEpoch(BrokerError, InvalidProducerEpoch):
    """A broker answered INVALID_PRODUCER_EPOCH."""


class BrokerNotCoordinator(BrokerError, NotCoordinator):
    """A broker answered NOT_COORDINATOR."""


class BrokerCoordinatorLoading(BrokerError, CoordinatorLoading):
    """A broker answered COORDINATOR_LOADING."""


class BrokerUnknownMemberId(BrokerError, UnknownMemberId):
    """A broker answered UNKNOWN_MEMBER_ID."""


class BrokerFencedMemberEpoch(BrokerError, FencedMemberEpoch):
    """A broker answered FENCED_MEMBER_EPOCH."""


class BrokerUnreleasedInstanceId(BrokerError, UnreleasedInstanceId):
    """A broker answered UNRELEASED_INSTANCE_ID."""


class BrokerPartitionNotAssigned(BrokerError, PartitionNotAssigned):
    """A broker answered PARTITION_NOT_ASSIGNED."""


class BrokerGroupNotEmpty(BrokerError, GroupNotEmptyError):
    """A broker answered GROUP_NOT_EMPTY."""


class BrokerUnknownGroup(BrokerError, UnknownGroup):
    """A broker answered UNKNOWN_GROUP."""


class BrokerInvalidGroup(BrokerError, InvalidGroup):
    """A broker answered INVALID_GROUP."""


class BrokerGroupHasZooKeeperMembers(BrokerError, GroupHasZooKeeperMembers):
    """A broker answered GROUP_HAS_ZOOKEEPER_MEMBERS."""


class MalformedReply(PylogError):
    """Client side: a reply's frames are missing, too short or too long, or not UTF-8 where
    text is due. The broker and the client disagree about the protocol; retrying will not help."""


class AuthenticationFailed(PylogError):
    """Client side: the Curve handshake with the broker at `endpoint` failed, so no request of
    this client reached it: the broker refused the client's key (its ZAP handler knows no
    principal of that key), or the handshake broke off (the client holds another broker key
    than the broker's, or the broker does not speak Curve). The message says which. Not
    retriable, and no BrokerError: the broker never answers, there is no wire code; the same
    keys are refused again until an operator changes them (pylogctl principal add)."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(message)
        self.endpoint = endpoint


class ZooKeeperStartError(PylogError):
    """The private ZooKeeper could not be started: java or the jar is missing, the server
    exited during start-up, or it did not answer `srvr` in time. The message says which and
    ends with the tail of the server's log when there is one. Retrying helps only when the
    cause was transient (a port taken meanwhile); a missing package needs scripts/setup."""
