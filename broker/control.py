"""Typed messages between the supervisor and its workers, both ways, and their one codec.

Every message crosses the ipc socket as two frames: its kind (`COMMAND`, supervisor to worker,
or `STATE`, worker to supervisor: broker.transport), then compact JSON of the message's fields
with its name under "type":

    C  {"type":"RenewLease","until":81234.5,"broker_epoch":4294967302}
    S  {"type":"AskIsr","topic":"clicks","partition":0,"leader_epoch":3,"isr":[1,2]}

`encode` makes the frames, `decode_command` and `decode_report` read them back into the
dataclasses below (ValueError for a frame that is not one: a bug, logged by the reader); each
side dispatches them with `match`. Nothing else crosses the process boundary as JSON.

Supervisor to worker (Command):

- OpenPartitions: open (recovering) each partition, a folder in a log directory, with its
  settings; `replicated` ones serve no client until a PartitionRole says they lead.
- DeletePartitions: stop serving them and remove their folders.
- ConfigureTopic: a topic's settings changed live.
- ReconfigureBroker: live broker settings changed (broker.config.LIVE_SETTINGS): the topics'
  defaults, how often retention runs, the log level.
- MoveLogStarts: records of a topic's partitions deleted (`pylogctl topic delete-records`):
  their log starts, as the registry asks them.
- PartitionRole: a replicated partition's state node as read (docs/replication.md): lead it,
  follow the leader at `endpoint`, or neither.
- RenewLease: the leaders' lease, renewed (broker.replication.lease).
- WakeFetch: answer now the MULTI_FETCH share behind this tag (broker.fetch_joins: another
  worker's share of the request brought data).

Worker to supervisor (Report):

- WorkerHello: connected (sent first): it gets the lease and its partitions.
- PartitionsOpened: the partitions opened, those that could not be (error code, message).
- PartitionsDeleted: a topic's partitions deleted.
- AskIsr: a leader asks for the ISR of a partition it leads in `leader_epoch` to become `isr`.
- StatsReport: the figures for the metrics endpoint (broker.worker_stats).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from broker.log.config import SettingValue
from broker.transport import COMMAND, STATE, json_frame

Settings = dict[str, SettingValue]


@dataclass(frozen=True)
class PartitionToOpen:
    topic: str
    partition: int
    directory: str
    """The log directory holding the partition's folder."""
    settings: Settings
    replicated: bool
    log_start: int = 0
    """Where the registry asks its log to start (records before it deleted)."""


@dataclass(frozen=True)
class OpenPartitions:
    partitions: tuple[PartitionToOpen, ...]

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> OpenPartitions:
        return cls(tuple(PartitionToOpen(**p) for p in fields["partitions"]))


@dataclass(frozen=True)
class DeletePartitions:
    topic: str
    partitions: tuple[tuple[int, str], ...]
    """Each partition's number and folder."""

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> DeletePartitions:
        return cls(fields["topic"], tuple((n, folder) for n, folder in fields["partitions"]))


@dataclass(frozen=True)
class ConfigureTopic:
    topic: str
    settings: Settings


@dataclass(frozen=True)
class ReconfigureBroker:
    values: dict[str, Any]
    """The live settings that changed, by flat name (broker.config.BrokerConfig)."""


@dataclass(frozen=True)
class MoveLogStarts:
    topic: str
    starts: tuple[tuple[int, int], ...]
    """Partition, the log start the registry asks."""

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> MoveLogStarts:
        return cls(fields["topic"], tuple((p, start) for p, start in fields["starts"]))


@dataclass(frozen=True)
class PartitionRole:
    """A replicated partition's state node (version `version`) as the supervisor read it."""

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    leader_broker_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    endpoint: str | None
    """The leader's front socket (None: no leader, or not registered yet)."""
    curve_key: str | None
    """The leader's public key in curve mode (broker.security), None in plaintext."""
    min_insync_replicas: int
    version: int

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> PartitionRole:
        return cls(**{**fields, "isr": tuple(fields["isr"]), "replicas": tuple(fields["replicas"])})


@dataclass(frozen=True)
class RenewLease:
    until: float
    """time.monotonic(), the machine's clock."""
    broker_epoch: int


@dataclass(frozen=True)
class WakeFetch:
    tag: str
    """The share's tag (FETCH_JOINED and its join's id), in hexadecimal."""


@dataclass(frozen=True)
class WorkerHello:
    index: int


@dataclass(frozen=True)
class PartitionsOpened:
    opened: tuple[tuple[str, int], ...] = ()
    failed: tuple[tuple[str, int, int, str], ...] = ()
    """Topic, partition, error code, message."""

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> PartitionsOpened:
        return cls(
            tuple((t, n) for t, n in fields["opened"]),
            tuple((t, n, code, message) for t, n, code, message in fields["failed"]),
        )


@dataclass(frozen=True)
class PartitionsDeleted:
    topic: str


@dataclass(frozen=True)
class AskIsr:
    topic: str
    partition: int
    leader_epoch: int
    isr: tuple[int, ...]

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> AskIsr:
        return cls(**{**fields, "isr": tuple(fields["isr"])})


@dataclass(frozen=True)
class StatsReport:
    snapshot: dict[str, Any] = field(default_factory=dict)


Command = (
    OpenPartitions
    | DeletePartitions
    | ConfigureTopic
    | ReconfigureBroker
    | MoveLogStarts
    | PartitionRole
    | RenewLease
    | WakeFetch
)
Report = WorkerHello | PartitionsOpened | PartitionsDeleted | AskIsr | StatsReport

_COMMANDS: dict[str, type[Command]] = {
    c.__name__: c
    for c in (
        OpenPartitions,
        DeletePartitions,
        ConfigureTopic,
        ReconfigureBroker,
        MoveLogStarts,
        PartitionRole,
        RenewLease,
        WakeFetch,
    )
}
_REPORTS: dict[str, type[Report]] = {
    r.__name__: r for r in (WorkerHello, PartitionsOpened, PartitionsDeleted, AskIsr, StatsReport)
}


def encode(message: Command | Report) -> list[bytes]:
    """The two frames of `message`: its kind, then its JSON."""
    kind = COMMAND if type(message).__name__ in _COMMANDS else STATE
    return [kind, json_frame({"type": type(message).__name__, **asdict(message)})]


def _decode(frame: bytes, types: dict[str, type[Any]]) -> Any:
    try:
        fields = json.loads(frame)
        kind = types[fields.pop("type")]
        from_fields = getattr(kind, "from_fields", None)
        return from_fields(fields) if from_fields is not None else kind(**fields)
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"not a control message: {bytes(frame[:200])!r} ({error!r})") from None


def decode_command(frame: bytes) -> Command:
    """The Command the second frame of a COMMAND message holds; ValueError if none."""
    command: Command = _decode(frame, _COMMANDS)
    return command


def decode_report(frame: bytes) -> Report:
    """The Report the second frame of a STATE message holds; ValueError if none."""
    report: Report = _decode(frame, _REPORTS)
    return report
