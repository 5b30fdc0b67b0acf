"""The dictionary configuration of the Kafka-shaped clients: the keys each takes, and each
value checked (docs/clients.md has what each key maps to)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from broker.client.kafka.errors import KafkaException
from broker.protocol import Ack
from broker.security import ClientKeys, KeyFileError

ACKS: Final = {"0": Ack.NONE, "1": Ack.WRITTEN, "-1": Ack.ALL, "all": Ack.ALL}
_TRUE: Final = frozenset({"true", "1", "yes"})
_FALSE: Final = frozenset({"false", "0", "no"})
ISOLATIONS: Final = {"read_committed": True, "read_uncommitted": True}
"""Both the same in pylog: it has no transactions, so every message stored is committed."""
RESETS: Final = {
    "earliest": "earliest",
    "smallest": "earliest",
    "beginning": "earliest",
    "latest": "latest",
    "largest": "latest",
    "end": "latest",
}


def flag(key: str, value: Any) -> bool:
    text = str(value).lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise KafkaException(f"{key}: {value!r} is not a boolean (true or false)")


def number(key: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not number >= 0:
        raise KafkaException(f"{key}: {value!r} is not a number of 0 or more")
    return number


def choice(key: str, value: Any, choices: Mapping[str, Any]) -> Any:
    chosen = choices.get(str(value).lower())
    if chosen is None:
        raise KafkaException(f"{key}: {value!r} is not one of {', '.join(choices)}")
    return chosen


def checked_settings(conf: Mapping[str, Any], known: Iterable[str], kind: str) -> dict[str, Any]:
    """`conf` checked: every key one of `known`, `bootstrap.servers` given."""
    if not isinstance(conf, Mapping):
        raise TypeError(f"a {kind} takes its configuration as a dict, not {type(conf).__name__}")
    taken = set(known)
    unknown = sorted(set(conf) - taken)
    if unknown:
        raise KafkaException(
            f"{', '.join(map(repr, unknown))}: not a pylog {kind} setting (taken: "
            f"{', '.join(sorted(taken))}; docs/clients.md says why the others are not)"
        )
    if not conf.get("bootstrap.servers"):
        raise KafkaException("bootstrap.servers: a broker's host:port (several, comma-separated)")
    return dict(conf)


def client_keys(conf: Mapping[str, Any]) -> ClientKeys | None:
    """The Curve keys of `pylog.key.file` and `pylog.broker.key`, checked against
    `security.protocol`: PLAINTEXT without them, CURVE (or SSL / SASL_SSL, taken as asking
    for encryption) with them."""
    key_file, broker_key = conf.get("pylog.key.file"), conf.get("pylog.broker.key")
    protocol = str(conf.get("security.protocol", "")).upper()
    if (key_file is None) != (broker_key is None):
        raise KafkaException(
            "pylog.key.file and pylog.broker.key go together: the client's secret key file and "
            "the brokers' public key (or its file)"
        )
    if key_file is None:
        if protocol not in ("", "PLAINTEXT"):
            raise KafkaException(
                f"security.protocol {protocol}: pylog encrypts with CurveZMQ; give "
                "pylog.key.file and pylog.broker.key (docs/security.md), or PLAINTEXT"
            )
        return None
    if protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        raise KafkaException(
            f"security.protocol {protocol} with Curve keys: say CURVE, or leave it out"
        )
    try:
        return ClientKeys.load(str(key_file), str(broker_key))
    except KeyFileError as error:
        raise KafkaException(f"pylog.key.file / pylog.broker.key: {error}") from None


COMMON_KEYS: Final = (
    "bootstrap.servers",
    "client.id",
    "security.protocol",
    "pylog.key.file",
    "pylog.broker.key",
    "request.timeout.ms",
    "logger",
)
PRODUCER_KEYS: Final = (
    *COMMON_KEYS,
    "acks",
    "request.required.acks",
    "enable.idempotence",
    "compression.type",
    "compression.codec",
    "compression.level",
    "linger.ms",
    "queue.buffering.max.ms",
    "batch.num.messages",
    "batch.size",
    "delivery.timeout.ms",
    "message.timeout.ms",
    "retries",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
    "on_delivery",
)
"""The keys a Producer takes (docs/clients.md has what each maps to)."""
CONSUMER_KEYS: Final = (
    *COMMON_KEYS,
    "group.id",
    "group.instance.id",
    "auto.offset.reset",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "session.timeout.ms",
    "max.poll.interval.ms",
    "group.remote.assignor",
    "fetch.wait.max.ms",
    "fetch.max.bytes",
    "max.partition.fetch.bytes",
    "enable.partition.eof",
    "isolation.level",
    "key.deserializer",
    "value.deserializer",
)
"""The keys a Consumer takes."""


def encoded(what: str, data: Any) -> bytes | None:
    """A value, key or header value as confluent-kafka takes it: bytes as they are, str as
    UTF-8, None as None."""
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"{what} is bytes or str, not {type(data).__name__}")
