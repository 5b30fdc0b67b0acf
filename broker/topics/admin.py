"""Topic administration on the supervisor's loop (broker.topics): CREATE_TOPIC, DELETE_TOPIC,
DESCRIBE_CONFIG and ALTER_CONFIG. Every registry call runs off the loop (RegistryCalls) and its
answer comes back as an event; the replies go to `answers`, which the front sends from.

A CREATE_TOPIC records the topic in ZooKeeper with its partitions dealt over the live brokers
(broker.placement), opens the ones held here, and is answered once every holder has registered
its partitions (asked of ZooKeeper every CREATE_CHECK_S at most), or after CREATE_WAIT_S: a
holder that died meanwhile leaves its partitions unavailable. A partition here that cannot be
created (a full disk) undoes the creation and answers its error.

A request that comes while the connection to ZooKeeper is down waits for it, up to half the
session timeout (`registry_wait_s`), and is refused with REGISTRY_UNAVAILABLE if it is not back
by then. A connection drops when one ping goes unanswered for 2/3 of the session timeout (a
busy machine, a paused server), and once the server answers again kazoo is back on the same
session in milliseconds: that is no outage, and such a request is sent when it is back. A
longer absence is answered at the deadline, never later; half the session timeout (3 s by
default) keeps that deadline inside the clients' default timeouts (pylogctl's 5 s), so that a
client that gave up is never followed by its request being sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from broker import protocol
from broker.config import (
    REPLICA_SETTINGS,
    TOPIC_SETTINGS,
    BrokerConfig,
    replica_setting,
    topic_settings,
)
from broker.errors import (
    InvalidTopic,
    PylogError,
    RegistryUnavailable,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from broker.log.config import SettingValue
from broker.logs import number_spans
from broker.pool import Answers
from broker.protocol import CREATE_WAIT_S, ErrorCode
from broker.registry import MAX_PARTITIONS, Registry, TopicConfig
from broker.registry_calls import RegistryCalls

if TYPE_CHECKING:
    from broker.topics import Topics

log = logging.getLogger("pylog.supervisor")

T = TypeVar("T")

CREATE_CHECK_S = 0.1
"""How often, at most, ZooKeeper is asked whether pending CREATE_TOPICs are served."""


@dataclass
class _PendingCreate:
    """A CREATE_TOPIC to answer once every holder serves its partitions."""

    topic: str
    config: TopicConfig
    tagged: bytes
    correlation_id: int
    deadline: float
    opening: set[int]
    """Its partitions held here that their worker has not yet opened nor failed to open."""
    failure: tuple[int, str] | None = None
    """The error code and message of a partition here that could not be created."""


@dataclass
class _AwaitingRegistry:
    """A request that waits for the connection to ZooKeeper to come back."""

    what: str
    send: Callable[[], None]
    refuse: Callable[[PylogError], None]
    deadline: float


def registry_wait_s(config: BrokerConfig) -> float:
    """How long a topic request waits for the connection to ZooKeeper: half the session
    timeout."""
    return config.zookeeper_session_timeout_ms / 2000


class TopicAdmin:
    """The topic administration requests taken by this broker, on `view`'s topics."""

    def __init__(
        self, view: Topics, config: BrokerConfig, calls: RegistryCalls, answers: Answers
    ) -> None:
        self.view = view
        self.config = config
        self.calls = calls
        self.answers = answers
        self.creating: set[str] = set()
        """Topics whose CREATE_TOPIC is being recorded in ZooKeeper."""
        self._creates_checking = False
        self._creates_checked_at = 0.0
        self._pending_creates: list[_PendingCreate] = []
        self._awaiting: list[_AwaitingRegistry] = []
        """Requests waiting for the connection to ZooKeeper, in the order they came."""

    def _connected(self) -> bool:
        registry = self.calls.registry
        assert registry is not None
        return registry.session.connected

    def _when_connected(
        self, what: str, send: Callable[[], None], refuse: Callable[[PylogError], None]
    ) -> None:
        """`send()` now if ZooKeeper is connected (and no request waits before this one),
        else once it is (`resume_awaiting`), or `refuse` REGISTRY_UNAVAILABLE if it is not
        within `registry_wait_s`. (Not a registry call that waits: the registry thread
        would hold the calls behind it, and a request would be sent after its client has
        given up.)"""
        if not self._awaiting and self._connected():
            send()
            return
        wait_s = registry_wait_s(self.config)
        log.info("%s waits up to %g s for the connection to ZooKeeper", what, wait_s)
        deadline = self.view.clock.monotonic() + wait_s
        self._awaiting.append(_AwaitingRegistry(what, send, refuse, deadline))

    def resume_awaiting(self) -> None:
        """Send the requests waiting for ZooKeeper once it is connected again; refuse those
        whose wait is over."""
        if not self._awaiting:
            return
        if self._connected():
            awaiting, self._awaiting = self._awaiting, []
            for request in awaiting:
                request.send()
            return
        now = self.view.clock.monotonic()
        for request in [r for r in self._awaiting if now >= r.deadline]:
            self._awaiting.remove(request)
            request.refuse(
                RegistryUnavailable(
                    f"{request.what}: ZooKeeper is not connected (waited "
                    f"{registry_wait_s(self.config):g} s): topics can be "
                    "created, deleted and configured once it is back"
                )
            )

    def create(
        self, request: protocol.CreateTopicRequest, tagged: bytes, correlation_id: int
    ) -> None:
        """Record the topic in ZooKeeper with its partitions dealt over the live brokers, open
        the ones held here, and answer once every holder has registered its partitions (or
        after CREATE_WAIT_S: a holder that died meanwhile leaves its partitions unavailable).
        A request refused at once raises its error."""
        protocol.check_topic_name(request.topic)
        if not 1 <= request.partitions <= MAX_PARTITIONS:
            raise InvalidTopic(
                f"partitions must be from 1 to {MAX_PARTITIONS}, not {request.partitions}"
            )
        settings = topic_settings(dict(request.config))
        topic = request.topic
        replication_factor = _checked(self.config, topic, settings)
        if topic in self.view.configs or topic in self.creating:
            raise TopicAlreadyExists(f"topic {topic!r} exists")
        me, rack = self.view.me, self.config.broker_rack or None

        def record(registry: Registry) -> TopicConfig:
            live = registry.brokers.read()  # now, not as last watched
            racks = {broker_id: info.rack for broker_id, info in live.items()}
            racks[me] = rack
            config = TopicConfig.spread(
                request.partitions,
                racks,
                settings,
                replication_factor=replication_factor,
                racks=racks,
            )
            registry.topics.create_topic_config(topic, config)
            return config

        def refused(error: PylogError) -> None:
            self.creating.discard(topic)
            self.answers.append((tagged, protocol.encode_error(correlation_id, error)))

        self.creating.add(topic)
        self._when_connected(
            f"create topic {topic!r}",
            lambda: self.calls.call(
                record, lambda config: self._created(topic, config, tagged, correlation_id), refused
            ),
            refused,
        )

    def _created(self, topic: str, config: TopicConfig, tagged: bytes, correlation_id: int) -> None:
        """A new topic is recorded in ZooKeeper: open its partitions here and answer once every
        holder serves its own (see _answer_creates)."""
        self.creating.discard(topic)
        self.view.configs[topic] = config
        self.view.hold_topic(topic, config)
        here = set(config.partitions_of(self.view.me))
        log.info(
            "created topic %r with %d partitions over brokers %s",
            topic,
            config.partitions,
            sorted(set(config.brokers)),
        )
        deadline = self.view.clock.monotonic() + CREATE_WAIT_S
        self._pending_creates.append(
            _PendingCreate(topic, config, tagged, correlation_id, deadline, here)
        )

    def note_opened(self, topic: str, number: int, failure: tuple[int, str] | None) -> None:
        """A worker opened a partition here (failure None) or could not (its error code and
        message): the CREATE_TOPIC waiting for it learns so."""
        for pending in self._pending_creates:
            if pending.topic == topic:
                pending.opening.discard(number)
                pending.failure = pending.failure or failure

    def answer_creates(self) -> None:
        """Answer CREATE_TOPIC requests whose partitions every holder now serves (asked of
        ZooKeeper on the registry thread, every CREATE_CHECK_S at most), and those that failed
        here."""
        for pending in [p for p in self._pending_creates if p.failure is not None]:
            self._pending_creates.remove(pending)
            self._undo_create(pending)
        now = self.view.clock.monotonic()
        if (
            not self._pending_creates
            or self._creates_checking
            or now < self._creates_checked_at + CREATE_CHECK_S
        ):
            return
        self._creates_checked_at = now
        self._creates_checking = True
        topics = [pending.topic for pending in self._pending_creates]
        self.calls.call(
            lambda registry: {topic: registry.topics.topic_brokers(topic) for topic in topics},
            self._on_served,
            lambda _: self._on_served({}),
        )

    def _on_served(self, registered: dict[str, dict[int, tuple[int, ...]]]) -> None:
        """What ZooKeeper says each pending CREATE_TOPIC's holders serve: answer those served
        (or past CREATE_WAIT_S)."""
        self._creates_checking = False
        now = self.view.clock.monotonic()
        waiting = []
        for pending in self._pending_creates:
            served = {
                p for partitions in registered.get(pending.topic, {}).values() for p in partitions
            }
            unserved = len(served) < pending.config.partitions or pending.opening
            if pending.failure is not None or (unserved and now < pending.deadline):
                waiting.append(pending)
                continue
            if len(served) < pending.config.partitions:
                log.warning(
                    "topic %r: partitions %s not served yet after %.0f s (their broker down?)",
                    pending.topic,
                    number_spans(set(range(pending.config.partitions)) - served),
                    CREATE_WAIT_S,
                )
            reply = protocol.encode_reply(pending.correlation_id, protocol.EmptyReply())
            self.answers.append((pending.tagged, reply))
        self._pending_creates = waiting

    def _undo_create(self, pending: _PendingCreate) -> None:
        """A topic one of whose partitions here could not be created is not created: its
        config is deleted from ZooKeeper and its partitions (and folders) here are dropped, then
        the CREATE_TOPIC is answered with the partition's error. If ZooKeeper cannot be
        reached, the topic stays, with that partition's error in METADATA."""
        topic = pending.topic
        assert pending.failure is not None
        code, message = pending.failure
        log.error("topic %r is not created: %s", topic, message)
        error = protocol.encode_error(pending.correlation_id, ErrorCode(code), message)

        def undone(_: None) -> None:
            self.view.configs.pop(topic, None)
            self.view.drop_topic(topic)
            self.answers.append((pending.tagged, error))

        def not_undone(failure: PylogError) -> None:
            log.error("topic %r: cannot undo its creation: %s", topic, failure)
            self.answers.append((pending.tagged, error))

        self.calls.call(
            lambda registry: registry.topics.delete_topic_config(topic), undone, not_undone
        )

    def delete(self, topic: str, tagged: bytes, correlation_id: int) -> None:
        """Delete the topic's config in ZooKeeper, then its partitions here (every holder
        deletes its own when its watch sees the config gone), then answer. A request refused
        at once raises its error."""
        if topic not in self.view.configs:
            raise UnknownTopicOrPartition(f"unknown topic {topic!r}")

        def deleted(_: None) -> None:
            if self.view.configs.pop(topic, None) is not None:
                self.view.drop_topic(topic)
                log.info("deleted topic %r", topic)
            reply = protocol.encode_reply(correlation_id, protocol.EmptyReply())
            self.answers.append((tagged, reply))

        self._call_when_connected(
            f"delete topic {topic!r}",
            lambda registry: registry.topics.delete_topic_config(topic),
            deleted,
            tagged,
            correlation_id,
        )

    def add_partitions(
        self, request: protocol.CreatePartitionsRequest, tagged: bytes, correlation_id: int
    ) -> None:
        """Give the topic `request.count` partitions in all in ZooKeeper, the new ones placed
        over the brokers registered (TopicNodes.add_partitions), then answer; the brokers they
        went to serve them once their watch sees them. A request refused at once raises its
        error."""
        topic, count = request.topic, request.count
        if topic not in self.view.configs:
            raise UnknownTopicOrPartition(f"unknown topic {topic!r}")

        def grown(config: TopicConfig) -> None:
            log.info("topic %r: grown to %d partitions", topic, config.partitions)
            reply = protocol.encode_reply(correlation_id, protocol.EmptyReply())
            self.answers.append((tagged, reply))

        self._call_when_connected(
            f"add partitions to topic {topic!r}",
            lambda registry: registry.topics.add_partitions(topic, count),
            grown,
            tagged,
            correlation_id,
        )

    def describe_config(self, topic: str, tagged: bytes, correlation_id: int) -> None:
        """Answer with every setting of `topic`: its own, read from ZooKeeper now (off the
        loop), or this broker's default."""

        def read(config: TopicConfig) -> None:
            effective = self.config.log_config(config.settings)
            settings: dict[str, SettingValue] = {k: getattr(effective, k) for k in TOPIC_SETTINGS}
            settings.update((k, replica_setting(config.settings, k)) for k in REPLICA_SETTINGS)
            values = protocol.settings_text(settings)
            entries = tuple(
                protocol.ConfigEntry(key, value, key in config.settings)
                for key, value in values.items()
            )
            reply = protocol.DescribeConfigReply(entries)
            self.answers.append((tagged, protocol.encode_reply(correlation_id, reply)))

        self._call_when_connected(
            f"describe the config of topic {topic!r}",
            lambda registry: registry.topics.topic_config(topic),
            read,
            tagged,
            correlation_id,
        )

    def alter_config(
        self, request: protocol.AlterConfigRequest, tagged: bytes, correlation_id: int
    ) -> None:
        """Change the settings of a topic in ZooKeeper, then answer; the brokers holding its
        partitions apply them when their watch sees the change (this one too). A request
        refused at once raises its error."""
        topic = request.topic
        changes = topic_settings(request.set)  # InvalidTopic for unknown keys and bad values
        if "replication_factor" in changes or "replication_factor" in request.delete:
            raise InvalidTopic(
                f"topic {topic!r}: replication_factor is fixed at creation (reassign the "
                "partitions' replicas to change it)"
            )
        for key in request.delete:
            if key not in TOPIC_SETTINGS and key not in REPLICA_SETTINGS:
                raise InvalidTopic(
                    f"unknown topic setting {key!r}: one of {', '.join(TOPIC_SETTINGS)}"
                )
        broker_config = self.config

        def change(settings: Mapping[str, SettingValue]) -> dict[str, SettingValue]:
            altered = {k: v for k, v in settings.items() if k not in request.delete}
            altered.update(changes)
            _checked(broker_config, topic, altered)
            return altered

        def altered(config: TopicConfig) -> None:
            log.info("topic %r: settings changed to %s", topic, dict(config.settings))
            self.answers.append(
                (tagged, protocol.encode_reply(correlation_id, protocol.EmptyReply()))
            )

        self._call_when_connected(
            f"alter the config of topic {topic!r}",
            lambda registry: registry.topics.alter_topic_settings(topic, change),
            altered,
            tagged,
            correlation_id,
        )

    def _call_when_connected(
        self,
        what: str,
        call: Callable[[Registry], T],
        done: Callable[[T], None],
        tagged: bytes,
        correlation_id: int,
    ) -> None:
        """`call(registry)` on the registry thread once ZooKeeper is connected
        (`_when_connected`), then `done(result)` on the loop; the request is answered with the
        error if the call fails or the connection does not come back in time."""

        def refused(error: PylogError) -> None:
            self.answers.append((tagged, protocol.encode_error(correlation_id, error)))

        self._when_connected(what, lambda: self.calls.call(call, done, refused), refused)


def _checked(config: BrokerConfig, topic: str, settings: Mapping[str, SettingValue]) -> int:
    """The replication factor of `topic`, whose own `settings` must fit together with this
    broker's defaults for the rest (LogConfig.check_relations) and min_insync_replicas be at
    most replication_factor; InvalidTopic else."""
    try:
        config.checked_log_config(settings)
    except ValueError as error:
        raise InvalidTopic(f"topic {topic!r}: {error}") from None
    replication_factor = replica_setting(settings, "replication_factor")
    min_insync = replica_setting(settings, "min_insync_replicas")
    if min_insync > replication_factor:
        raise InvalidTopic(
            f"topic {topic!r}: min_insync_replicas {min_insync} is more than its "
            f"replication_factor {replication_factor}: ack=all could never be answered"
        )
    return replication_factor
