"""Topics in the registry: each topic's configuration (/config/topics/<topic>, persistent)
and the partitions each broker serves (/brokers/topics/<topic>/<broker_id>, ephemeral)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kazoo.recipe.watchers import DataWatch

from broker.errors import (
    InvalidTopic,
    RegistryUnavailable,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)
from broker.protocol import check_topic_name
from broker.registry.nodes import (
    decode,
    encode,
    int_field,
    int_list,
    is_int,
    validate_broker_id,
)
from broker.registry.session import BadVersion, NodeExists, NoNode, NotEmpty, Session

log = logging.getLogger(__name__)

ALTER_ATTEMPTS = 10
"""How many times alter_topic_settings reads and writes a configuration that others keep
changing between its read and its write, before it gives up."""

Settings = Mapping[str, int | None]


@dataclass(frozen=True)
class TopicConfig:
    """What /config/topics/<topic> holds: the topic's partition count, the broker that holds
    each partition (`brokers[p]` holds partition p, fixed at creation) and the topic's own
    settings (setting name -> integer, or None to switch that limit off); a setting left out
    takes the broker's [log] default.
    """

    partitions: int
    brokers: tuple[int, ...]
    settings: Mapping[str, int | None] = field(default_factory=dict)

    @classmethod
    def spread(
        cls,
        partitions: int,
        brokers: Iterable[int],
        settings: Mapping[str, int | None] | None = None,
    ) -> TopicConfig:
        """`partitions` partitions dealt round robin over `brokers` in id order: partition p
        goes to the (p mod n)-th broker. InvalidTopic when there is no broker."""
        ids = sorted(set(brokers))
        if not ids:
            raise InvalidTopic("no live broker to hold the topic's partitions")
        holders = tuple(ids[p % len(ids)] for p in range(max(partitions, 0)))
        return cls(partitions, holders, dict(settings or {}))

    def partitions_of(self, broker_id: int) -> list[int]:
        """The partitions that `broker_id` holds, in order."""
        return [p for p, holder in enumerate(self.brokers) if holder == broker_id]

    def validate(self, topic: str) -> None:
        """Raise InvalidTopic when partitions is not >= 1, brokers does not name one broker
        per partition, or a setting is not int | None."""
        if not is_int(self.partitions) or self.partitions < 1:
            raise InvalidTopic(f"topic {topic!r}: partitions must be >= 1, not {self.partitions!r}")
        if len(self.brokers) != self.partitions or not all(
            is_int(b) and b >= 0 for b in self.brokers
        ):
            raise InvalidTopic(
                f"topic {topic!r}: brokers must name one broker id per partition, "
                f"not {self.brokers!r}"
            )
        for name, value in self.settings.items():
            if not isinstance(name, str) or not (value is None or is_int(value)):
                raise InvalidTopic(
                    f"topic {topic!r}: setting {name!r} must be an integer or None, not {value!r}"
                )

    def to_json(self) -> bytes:
        return encode(
            {
                "partitions": self.partitions,
                "brokers": list(self.brokers),
                "settings": dict(self.settings),
            }
        )

    @classmethod
    def from_json(cls, data: bytes) -> TopicConfig:
        """Parse node data; ValueError when it is not a topic configuration."""
        obj = decode(data)
        settings = obj.get("settings", {})
        if not isinstance(settings, dict):
            raise ValueError("'settings' is not an object")
        if not all(v is None or is_int(v) for v in settings.values()):
            raise ValueError("a setting is not an integer or null")
        partitions = int_field(obj, "partitions")
        brokers = int_list(obj, "brokers")
        if len(brokers) != partitions:
            raise ValueError(f"'brokers' names {len(brokers)} brokers for {partitions} partitions")
        return cls(partitions, brokers, settings)


def _partitions(data: bytes) -> tuple[int, ...]:
    return int_list(decode(data), "partitions")


class Topics(Session):
    """The registry's calls on topics: their configurations and who serves their partitions.

    A request that timed out may still be applied by the server later: the registrations are
    idempotent, and a create_topic_config retried after a timeout may answer
    TopicAlreadyExists for its own first attempt."""

    def topic_broker_path(self, topic: str, broker_id: int) -> str:
        return f"{self.chroot}/brokers/topics/{topic}/{broker_id}"

    def topic_config_path(self, topic: str) -> str:
        return f"{self.chroot}/config/topics/{topic}"

    # -- topic partitions on brokers ---------------------------------------------------------

    def register_topic_partitions(
        self, topic: str, broker_id: int, partitions: Iterable[int]
    ) -> None:
        """Create (or update) the ephemeral /brokers/topics/<topic>/<broker_id> saying that the
        broker holds (and serves) `partitions` of the topic, kept until stop() or unregister.

        On RegistryUnavailable the registration is remembered and made once connected."""
        check_topic_name(topic)
        validate_broker_id(broker_id)
        numbers = sorted(partitions)
        if not numbers or not all(is_int(p) and p >= 0 for p in numbers):
            raise InvalidTopic(f"topic {topic!r}: partitions must be numbers >= 0, not {numbers}")
        self._register(self.topic_broker_path(topic, broker_id), encode({"partitions": numbers}))

    def unregister_topic(self, topic: str, broker_id: int) -> None:
        """Delete /brokers/topics/<topic>/<broker_id> (and the topic's node once empty)."""
        check_topic_name(topic)
        validate_broker_id(broker_id)
        self._unregister(self.topic_broker_path(topic, broker_id))
        with contextlib.suppress(NoNode, NotEmpty):
            self._delete(f"{self.chroot}/brokers/topics/{topic}")

    def topic_brokers(self, topic: str) -> dict[int, tuple[int, ...]]:
        """Broker id -> the partitions of `topic` it serves, for the live brokers holding it."""
        check_topic_name(topic)
        return self._read_all(f"{self.chroot}/brokers/topics/{topic}", _partitions, int)

    # -- topic configurations ----------------------------------------------------------------

    def create_topic_config(self, topic: str, config: TopicConfig) -> None:
        """Create the persistent /config/topics/<topic>; TopicAlreadyExists if it exists."""
        check_topic_name(topic)
        config.validate(topic)
        try:
            self._create(self.topic_config_path(topic), config.to_json(), makepath=True)
        except NodeExists:
            raise TopicAlreadyExists(f"topic {topic!r} exists already") from None

    def delete_topic_config(self, topic: str) -> None:
        """Delete /config/topics/<topic>; UnknownTopicOrPartition if there is none."""
        check_topic_name(topic)
        try:
            self._delete(self.topic_config_path(topic))
        except NoNode:
            raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None

    def topic_config(self, topic: str) -> TopicConfig:
        """The configuration of `topic`; UnknownTopicOrPartition if there is none."""
        check_topic_name(topic)
        return self._read_config(topic)[0]

    def _read_config(self, topic: str) -> tuple[TopicConfig, int]:
        """The configuration of `topic` and its node's version."""
        path = self.topic_config_path(topic)
        try:
            data, stat = self._get(path)
        except NoNode:
            raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None
        try:
            return TopicConfig.from_json(data), stat.version
        except ValueError as error:
            raise RegistryUnavailable(f"{path} holds unreadable data: {error}") from None

    def alter_topic_settings(
        self, topic: str, change: Callable[[Settings], Settings]
    ) -> TopicConfig:
        """Replace the settings of `topic` with `change(settings)`, a conditional write on the
        version read, so that two changes at once both count (read again and retried, up to
        ALTER_ATTEMPTS times, when another write came between). Returns the new configuration.
        UnknownTopicOrPartition if there is none; what `change` raises, as it is."""
        check_topic_name(topic)
        path = self.topic_config_path(topic)
        for _ in range(ALTER_ATTEMPTS):
            config, version = self._read_config(topic)
            altered = dataclasses.replace(config, settings=dict(change(config.settings)))
            altered.validate(topic)
            try:
                self._set(path, altered.to_json(), version)
            except BadVersion:
                continue
            except NoNode:
                raise UnknownTopicOrPartition(f"topic {topic!r} does not exist") from None
            return altered
        raise RegistryUnavailable(
            f"{path} changed under each of {ALTER_ATTEMPTS} attempts to alter it: try again"
        )

    def watch_topic_config(
        self, topic: str, callback: Callable[[TopicConfig | None], bool]
    ) -> None:
        """Call `callback(config)` with the configuration of `topic` now and whenever its node's
        data changes, and None once the node is deleted, until stop() or the callback returns
        False. kazoo's DataWatch keeps the watch armed, across reconnections and session
        expiries (it reads the node again then, and calls back if it changed meanwhile); it
        is armed on a thread of kazoo's, so this call does not wait on ZooKeeper. The callback
        runs on kazoo's threads: it must only hand the value on. A node whose data cannot be
        read as a configuration is logged and passed over."""
        check_topic_name(topic)
        self._check_open()
        path = self.topic_config_path(topic)
        stopped = self._stopped

        def changed(data: bytes | None, stat: Any) -> bool:
            if stopped.is_set():
                return False
            if stat is None:
                return callback(None)
            try:
                config = TopicConfig.from_json(data or b"")
            except ValueError as error:
                log.error("%s holds unreadable data, passed over: %s", path, error)
                return True
            return callback(config)

        self._client.handler.spawn(DataWatch, self._client, path, changed)

    def topic_configs(self) -> dict[str, TopicConfig]:
        """Every topic's configuration: name -> TopicConfig (unreadable nodes are left out)."""
        return self._read_all(f"{self.chroot}/config/topics", TopicConfig.from_json, str)

    def watch_topic_configs(self, callback: Callable[[dict[str, TopicConfig]], None]) -> None:
        """Call `callback(topic_configs())` now and whenever a topic is created or deleted,
        until stop(). (A node's data is not watched here: watch_topic_config does that.)"""
        self._add_watch(f"{self.chroot}/config/topics", TopicConfig.from_json, str, callback)
