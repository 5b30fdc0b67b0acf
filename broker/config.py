"""The broker's settings: one table of them, read from a TOML file and overridden by flags.

Every setting has a TOML key in a section and a flag made from the two (`[log] flush_messages`
is `--log-flush-messages`); deploy/pylogd.toml is the commented example of every key. The
`[log]` settings are the defaults of every topic; a topic created with its own values (see
TOPIC_SETTINGS) keeps them in ZooKeeper under /config/topics/<topic>.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.errors import InvalidTopic
from broker.log.config import (
    CHOICES,
    MAX_SETTING,
    LogConfig,
    SettingValue,
    bound_problem,
    choice_problem,
)
from broker.logs import FORMATS
from broker.security import check_principal_name


@dataclass(frozen=True, slots=True)
class Setting:
    section: str
    key: str
    kind: type
    default: Any
    help: str
    optional: bool = False
    """Whether "none" (TOML: the string "none") switches the limit off."""

    @property
    def name(self) -> str:
        """The BrokerConfig field and the flag: section_key."""
        return f"{self.section}_{self.key}"

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


_LOG = LogConfig()

SETTINGS: tuple[Setting, ...] = (
    Setting("broker", "id", int, 0, "This broker's id, unique in the cluster."),
    Setting("broker", "host", str, "127.0.0.1", "Address the front socket binds to."),
    Setting("broker", "port", int, 9092, "TCP port of the front socket."),
    Setting(
        "broker",
        "advertised_host",
        str,
        "",
        "Host clients are told to connect to (default: broker.host).",
    ),
    Setting(
        "broker",
        "advertised_port",
        int,
        0,
        "Port clients and followers are told to connect to, for a broker reached through a "
        "port forward or a proxy (0: broker.port as bound).",
    ),
    Setting(
        "broker",
        "data_dir",
        str,
        "/var/lib/pylog",
        "Where the broker keeps its state: "
        "the private ZooKeeper, worker sockets, and the log dirs unless given.",
    ),
    Setting(
        "broker",
        "log_dirs",
        list,
        [],
        "Log directories, one per disk or RAID volume "
        "(default: <data_dir>/logs); each gets its own workers.",
    ),
    Setting("broker", "workers_per_dir", int, 1, "Worker processes per log directory."),
    Setting(
        "broker",
        "rack",
        str,
        "",
        "The rack (or room, or zone) of this broker: a replicated topic's replicas go to "
        "distinct racks where it can (docs/replication.md).",
    ),
    Setting(
        "broker",
        "replica_lag_max_ms",
        int,
        10_000,
        "A follower that has not caught up with its leader for this long leaves the in-sync set.",
    ),
    Setting(
        "broker",
        "replica_fetch_max_bytes",
        int,
        1 << 20,
        "The most bytes a follower asks its leader for in one fetch.",
    ),
    Setting(
        "broker",
        "replica_fetch_wait_ms",
        int,
        500,
        "How long a follower's fetch waits at its leader for new data.",
    ),
    Setting(
        "broker",
        "leader_rebalance_interval_ms",
        int,
        30_000,
        "How often the controller moves leadership back to each partition's preferred leader "
        "where it is alive and in sync (docs/replication.md); 0 switches it off.",
    ),
    Setting(
        "broker",
        "retention_guard_interval_ms",
        int,
        30_000,
        "How often the broker forecasts, for each consumer group it coordinates, when retention "
        "deletes what the group has not read yet (the pylog_group_retention_seconds gauge; "
        'docs/storage.md, "Retention"); 0 switches it off.',
    ),
    Setting(
        "broker",
        "retention_warning_ms",
        int,
        3_600_000,
        "A group whose unread messages retention deletes within this long is warned of in the "
        "log of the broker that coordinates it; 0 switches the warning off.",
    ),
    Setting(
        "broker",
        "shutdown_timeout_ms",
        int,
        30_000,
        "How long workers get to flush and exit on shutdown before they are killed.",
    ),
    Setting(
        "broker",
        "log_format",
        str,
        "text",
        'How pylogd logs to stderr: "text" (for people) or "json" (one object a line).',
    ),
    Setting(
        "broker",
        "log_level",
        str,
        "info",
        "The least level pylogd logs: debug, info, warning or error (-v: debug).",
    ),
    Setting(
        "broker",
        "queued_request_bytes",
        int,
        8 << 20,
        "Request bytes the front passes to workers before they take them; beyond this it "
        "reads no more requests until they do (TCP then blocks the senders).",
    ),
    Setting(
        "broker",
        "queued_requests_per_client",
        int,
        64,
        "Requests of one connection read ahead of the front (its ZeroMQ RCVHWM), on top of "
        "queued_request_bytes.",
    ),
    Setting(
        "broker",
        "fetch_max_bytes",
        int,
        1 << 20,
        "The most message bytes a FETCH reply carries, whatever its max_bytes (but always "
        "the first message whole, when it fits in max_bytes).",
    ),
    Setting(
        "broker",
        "queued_replies_per_client",
        int,
        1000,
        "Replies the front holds for one connection that has not taken them (its ZeroMQ "
        "SNDHWM); beyond this, ZeroMQ drops them.",
    ),
    Setting(
        "broker",
        "queued_reply_bytes",
        int,
        128 << 20,
        "Bytes of replies the broker holds for all its clients together; at this, every "
        "connection that holds any is muted (its requests wait, its large replies are "
        "refused REPLIES_NOT_READ) until it reads them.",
    ),
    Setting(
        "broker",
        "queued_reply_bytes_per_client",
        int,
        16 << 20,
        "Bytes of replies the broker holds for one connection that has not taken them; at "
        "this, the connection is muted until it reads them.",
    ),
    Setting(
        "log",
        "flush_messages",
        int,
        _LOG.flush_messages,
        "Flush once this many messages are pending in a partition.",
    ),
    Setting(
        "log",
        "flush_interval_ms",
        int,
        _LOG.flush_interval_ms,
        "Flush once the oldest pending message has waited this long.",
    ),
    Setting(
        "log",
        "fsync",
        bool,
        _LOG.fsync,
        "Whether a flush fsyncs (durability of flushed messages across power loss).",
    ),
    Setting(
        "log",
        "flush_when_idle",
        bool,
        True,
        "Flush new messages as soon as their worker has served every request that has come, "
        "besides by flush_messages and flush_interval_ms: consumers see them within "
        "milliseconds, and under load the flushes batch by themselves (group commit).",
    ),
    Setting(
        "log",
        "segment_bytes",
        int,
        _LOG.segment_bytes,
        "Roll to a new segment before one grows past this.",
    ),
    Setting(
        "log",
        "segment_ms",
        int,
        _LOG.segment_ms,
        "Roll once a segment has been active this long.",
        optional=True,
    ),
    Setting(
        "log",
        "retention_ms",
        int,
        _LOG.retention_ms,
        "Delete closed segments older than this.",
        optional=True,
    ),
    Setting(
        "log",
        "retention_bytes",
        int,
        _LOG.retention_bytes,
        "Delete the oldest closed segments while a partition holds more than this.",
        optional=True,
    ),
    Setting(
        "log",
        "max_message_bytes",
        int,
        _LOG.max_message_bytes,
        "The largest message accepted, on disk.",
    ),
    Setting(
        "log",
        "index_interval_bytes",
        int,
        _LOG.index_interval_bytes,
        "Bytes between sparse index entries.",
    ),
    Setting(
        "log",
        "compression",
        str,
        _LOG.compression,
        "How a topic stores producers' sets unless it says otherwise: producer (as they come), "
        "or none, gzip, lz4 or zstd (every set stored so: docs/storage.md, Compressed sets).",
    ),
    Setting("log", "retention_check_interval_ms", int, 60_000, "How often retention runs."),
    Setting(
        "log",
        "max_open_files",
        int,
        None,
        "Segment files (write handles and read mappings) a worker keeps open at most; the least "
        "recently used are closed and opened again when next used. none: as many as the "
        "process's limits allow (its open-file limit less 128, at most half vm.max_map_count).",
        optional=True,
    ),
    Setting(
        "metrics",
        "enabled",
        bool,
        False,
        "Serve Prometheus metrics over HTTP at http://HOST:PORT/metrics.",
    ),
    Setting("metrics", "host", str, "127.0.0.1", "Address the metrics endpoint binds to."),
    Setting("metrics", "port", int, 9097, "TCP port of the metrics endpoint (0: a free one)."),
    Setting(
        "security",
        "mode",
        str,
        "plaintext",
        "plaintext (no authentication, no ACLs; refused on any address but loopback unless "
        "allow_plaintext_remote) or curve (CurveZMQ encryption, principals and ACLs).",
    ),
    Setting(
        "security",
        "key_file",
        str,
        "",
        "The broker's secret key file in curve mode (pylogctl keys generate); default "
        "<data_dir>/keys/broker.key_secret.",
    ),
    Setting(
        "security",
        "broker_keys",
        list,
        [],
        "Other public keys (or key files) of the cluster's brokers besides key_file's own, "
        "while the brokers' key pair changes: a broker presenting one is let in as a broker "
        "(its followers replicate), and followers trust a leader holding one (docs/security.md).",
    ),
    Setting(
        "security",
        "allow_plaintext_remote",
        bool,
        False,
        "Serve plaintext on an address other than loopback: anyone who reaches the port may "
        "produce, fetch and delete, and read the traffic.",
    ),
    Setting(
        "security",
        "allow_open_registry",
        bool,
        False,
        "In curve mode, start with an external ZooKeeper and no zookeeper.auth_file: anyone who "
        "reaches ZooKeeper may then add a principal, grant it every ACL and delete topics.",
    ),
    Setting(
        "security",
        "principals_file",
        str,
        "",
        "A file of principals (NAME KEY a line) let in besides those in ZooKeeper.",
    ),
    Setting(
        "security",
        "super_users",
        list,
        [],
        "Principals that may do anything, without ACLs (the operator's).",
    ),
    Setting(
        "zookeeper",
        "connect",
        str,
        "",
        "ZooKeeper ensemble, host:port[,host:port]; empty "
        "runs a private standalone ZooKeeper under <data_dir>/zookeeper.",
    ),
    Setting(
        "zookeeper", "chroot", str, "/pylog", "The znode under which pylog keeps its registry."
    ),
    Setting("zookeeper", "session_timeout_ms", int, 6_000, "ZooKeeper session timeout."),
    Setting("zookeeper", "port", int, 0, "Port of the private ZooKeeper (0: a free one)."),
    Setting("zookeeper", "tick_time_ms", int, 2_000, "tickTime of the private ZooKeeper."),
    Setting(
        "zookeeper",
        "auth_file",
        str,
        "",
        "A file of one line user:password: the brokers' ZooKeeper digest identity; when set, "
        "pylog's znodes are created with digest ACLs (docs/security.md). In curve mode with the "
        "private ZooKeeper, <data_dir>/zookeeper.auth, made on first start, when not set.",
    ),
)

TOPIC_SETTINGS = (
    "flush_messages",
    "flush_interval_ms",
    "segment_bytes",
    "segment_ms",
    "retention_ms",
    "retention_bytes",
    "max_message_bytes",
    "compression",
)
"""The LogConfig fields a topic may set for itself when it is created."""

REPLICA_SETTINGS: Mapping[str, tuple[int, int]] = {
    "replication_factor": (1, 255),
    "min_insync_replicas": (1, 255),
    "unclean_leader_election": (0, 1),
}
"""The topic settings of replication (docs/replication.md), each with its least and largest
value; none is a LogConfig field. replication_factor is given at creation only; a setting left
out is its least value (1, 1 and 0)."""

SECURITY_MODES = ("plaintext", "curve")
LOG_LEVELS = ("debug", "info", "warning", "error")
CHOSEN: frozenset[str] = frozenset({"broker_log_level", "broker_log_format", "security_mode"})
"""The settings whose value is one of a few words, taken in any case."""

LIVE_SETTINGS: frozenset[str] = frozenset(
    {
        *(f"log_{name}" for name in TOPIC_SETTINGS),
        "log_flush_when_idle",
        "log_retention_check_interval_ms",
        "broker_queued_request_bytes",
        "broker_queued_reply_bytes",
        "broker_queued_reply_bytes_per_client",
        "broker_log_level",
    }
)
"""The settings a running broker takes from ZooKeeper (`pylogctl broker config set`): the
topics' defaults, how often retention runs, the front's ceilings on what it holds for clients
(docs/protocol.md, "Flow control"), the log level. Every other one is read at start only."""

_BY_NAME = {s.name: s for s in SETTINGS}
_DIGITS = re.compile("[0-9]+")
_OPTIONAL_TOPIC = {"segment_ms", "retention_ms", "retention_bytes"}


class SettingTypes:
    """The type of each setting of SETTINGS by its flat name, as BrokerConfig gives it: for type
    checkers, and checked against SETTINGS (kind, and None where "none" switches a limit off)
    by tests/broker/test_config.py, so that the two cannot drift."""

    __slots__ = ()

    broker_id: int
    broker_host: str
    broker_port: int
    broker_advertised_host: str
    broker_advertised_port: int
    broker_data_dir: str
    broker_log_dirs: list[str]
    broker_workers_per_dir: int
    broker_rack: str
    broker_replica_lag_max_ms: int
    broker_replica_fetch_max_bytes: int
    broker_replica_fetch_wait_ms: int
    broker_leader_rebalance_interval_ms: int
    broker_retention_guard_interval_ms: int
    broker_retention_warning_ms: int
    broker_shutdown_timeout_ms: int
    broker_log_format: str
    broker_log_level: str
    broker_queued_request_bytes: int
    broker_queued_requests_per_client: int
    broker_fetch_max_bytes: int
    broker_queued_replies_per_client: int
    broker_queued_reply_bytes: int
    broker_queued_reply_bytes_per_client: int
    log_flush_messages: int
    log_flush_interval_ms: int
    log_fsync: bool
    log_flush_when_idle: bool
    log_segment_bytes: int
    log_segment_ms: int | None
    log_retention_ms: int | None
    log_retention_bytes: int | None
    log_max_message_bytes: int
    log_index_interval_bytes: int
    log_compression: str
    log_retention_check_interval_ms: int
    log_max_open_files: int | None
    metrics_enabled: bool
    metrics_host: str
    metrics_port: int
    security_mode: str
    security_key_file: str
    security_broker_keys: list[str]
    security_allow_plaintext_remote: bool
    security_allow_open_registry: bool
    security_principals_file: str
    security_super_users: list[str]
    zookeeper_connect: str
    zookeeper_chroot: str
    zookeeper_session_timeout_ms: int
    zookeeper_port: int
    zookeeper_tick_time_ms: int
    zookeeper_auth_file: str


@dataclass(frozen=True, slots=True)
class BrokerConfig(SettingTypes):
    """Every setting by its flat name (`log_flush_messages`), typed as SettingTypes says; see
    SETTINGS for their meaning, defaults and bounds, LIVE_SETTINGS for those taken live."""

    values: Mapping[str, Any] = field(default_factory=dict)

    if not TYPE_CHECKING:  # type checkers see SettingTypes, and a name not there is an error

        def __getattr__(self, name: str) -> Any:
            try:
                return self.values[name] if name in self.values else _BY_NAME[name].default
            except KeyError:
                raise AttributeError(name) from None

    def take_live(self, changed: BrokerConfig) -> dict[str, Any]:
        """Take `changed`'s LIVE_SETTINGS in place: every part of the process holding this
        config reads them from its next use (those that copied a value at start are told:
        broker.supervisor, broker.worker). Returns the settings that changed, by flat name."""
        values = self.values
        assert isinstance(values, dict)  # made by load_config, or from JSON: a dict
        taken = {
            name: getattr(changed, name)
            for name in sorted(LIVE_SETTINGS)
            if getattr(changed, name) != getattr(self, name)
        }
        values.update(taken)
        return taken

    @property
    def log_dir_paths(self) -> list[Path]:
        dirs = self.values.get("broker_log_dirs") or [Path(self.broker_data_dir) / "logs"]
        return [Path(d) for d in dirs]

    @property
    def key_file_path(self) -> Path:
        """The broker's secret key file (curve mode)."""
        default = Path(self.broker_data_dir) / "keys" / "broker.key_secret"
        return Path(self.security_key_file) if self.security_key_file else default

    @property
    def endpoint_host(self) -> str:
        return str(self.broker_advertised_host or self.broker_host)

    def endpoint_port(self, bound: int) -> int:
        """The port this broker registers for others to connect to: broker.advertised_port,
        or `bound`, the front's port as bound, when that is 0."""
        return int(self.broker_advertised_port or bound)

    def log_config(self, topic_settings: Mapping[str, SettingValue] | None = None) -> LogConfig:
        """The LogConfig of a topic: the [log] defaults, then the topic's own settings."""
        values = {f.name: getattr(self, f"log_{f.name}") for f in dataclasses.fields(LogConfig)}
        values.update((k, v) for k, v in (topic_settings or {}).items() if k in values)
        return LogConfig(**values)

    def checked_log_config(
        self, topic_settings: Mapping[str, SettingValue] | None = None
    ) -> LogConfig:
        """log_config, and ValueError unless its settings fit together (LogConfig.
        check_relations): for the defaults at start and a topic's settings on create and alter.
        Opening a partition takes what is stored as it is (log_config)."""
        config = self.log_config(topic_settings)
        config.check_relations()
        return config


def parse_setting(setting: Setting, value: Any) -> Any:
    """A setting's value checked against its type; text from a flag is converted (the value
    of a setting of choices in any case: `DEBUG` is `debug`)."""
    if setting.optional and (value is None or value == "none"):
        return None
    if setting.name in CHOSEN and isinstance(value, str):
        value = value.lower()
    kind = setting.kind
    if kind is bool and isinstance(value, str):
        if value.lower() not in ("true", "false"):
            raise ValueError(f"{setting.name} must be true or false, not {value!r}")
        return value.lower() == "true"
    if kind is int and isinstance(value, str):
        # ASCII digits only, as a topic setting's text: int() would also take "+5", " 5", "5_0"
        # and other scripts' digits
        if not _DIGITS.fullmatch(value):
            raise ValueError(
                f"{setting.name} must be a whole number in decimal digits 0-9, not {value!r}"
            )
        value = int(value)
    if kind is int and isinstance(value, int) and value > MAX_SETTING:
        raise ValueError(f"{setting.name} must be at most {MAX_SETTING}, not {value}")
    if kind is list and isinstance(value, str):
        value = [v for v in value.split(",") if v]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{setting.name} must be of type {kind.__name__}, not {value!r}")
    if isinstance(value, int) and value < 0:
        raise ValueError(f"{setting.name} must not be negative, not {value}")
    if isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise ValueError(f"{setting.name} must be a list of strings, not {value!r}")
    return value


def check_values(values: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in values.items():
        if name not in _BY_NAME:
            raise ValueError(f"unknown setting {name!r}")
        out[name] = parse_setting(_BY_NAME[name], value)
    return out


def load_config(path: Path | None, overrides: Mapping[str, Any]) -> BrokerConfig:
    """Read the TOML file (if any), apply flag `overrides` (flat names), and check the result.

    Raises ValueError naming the file and the key for anything unknown or out of range."""
    values: dict[str, Any] = {}
    if path is not None:
        try:
            document = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ValueError(f"{path}: {error}") from error
        for section, table in document.items():
            if not isinstance(table, dict):
                raise ValueError(f"{path}: {section!r} must be a [section], not a value")
            for key, value in table.items():
                name = f"{section}_{key}"
                if name not in _BY_NAME:
                    raise ValueError(f"{path}: unknown setting [{section}] {key}")
                try:
                    values[name] = parse_setting(_BY_NAME[name], value)
                except ValueError as error:
                    raise ValueError(f"{path}: {error}") from None
    values.update(check_values(overrides))
    config = BrokerConfig(values)
    try:
        check_config(config)
    except ValueError as error:
        raise ValueError(f"{f'{path}: ' if path else ''}{error}") from None
    return config


def setting_name(flat: str) -> str:
    """A setting's dotted name (`log.flush_interval_ms`) from its flat one."""
    setting = _BY_NAME[flat]
    return f"{setting.section}.{setting.key}"


def setting_named(name: str) -> Setting:
    """The setting of a dotted name, as the TOML file and the settings table give it
    (`log.flush_interval_ms`); ValueError for an unknown one, naming the nearest."""
    setting = _BY_NAME.get(name.replace(".", "_", 1)) if "." in name else None
    if setting is None:
        names = [setting_name(flat) for flat in _BY_NAME]
        near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        if not near:  # "log.level": the key alone, in whichever section
            key = name.rpartition(".")[2]
            near = [n for n in names if n.endswith(f"_{key}") or n.endswith(f".{key}")][:1]
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"unknown setting {name!r}{hint}: a [section] key as pylogd.toml has it")
    return setting


def with_live(config: BrokerConfig, changes: Mapping[str, str]) -> BrokerConfig:
    """`config` with live settings changed, each given by its dotted name and its text as a
    flag takes it; ValueError naming the first that is unknown, read at start only, out of
    range, or that does not fit with the rest."""
    values = dict(config.values)
    for name, text in changes.items():
        setting = setting_named(name)
        if setting.name not in LIVE_SETTINGS:
            raise ValueError(
                f"{name} is read at start only: change it in pylogd.toml (or its flag "
                f"{setting.flag}) and restart the broker"
            )
        try:
            values[setting.name] = parse_setting(setting, text)
        except ValueError as error:  # named as it was given, not as the flat name
            raise ValueError(str(error).replace(setting.name, name, 1)) from None
    changed = BrokerConfig(values)
    try:
        check_config(changed)
    except ValueError as error:
        for given in changes:  # a setting given, named as it was given
            flat = setting_named(given).name
            if str(error).startswith(flat):
                raise ValueError(str(error).replace(flat, given, 1)) from None
        raise
    return changed


def check_config(config: BrokerConfig) -> None:
    """ValueError naming the first setting out of its range or not fitting with the others."""
    try:
        config.checked_log_config()  # the [log] values, each and together
    except ValueError as error:
        raise ValueError(f"[log] {error}") from None
    if config.broker_log_level not in LOG_LEVELS:
        raise ValueError(
            f"broker_log_level must be one of {', '.join(LOG_LEVELS)}, "
            f"not {config.broker_log_level!r}"
        )
    if config.broker_log_format not in FORMATS:
        raise ValueError(
            f"broker_log_format must be one of {', '.join(FORMATS)}, "
            f"not {config.broker_log_format!r}"
        )
    if config.security_mode not in SECURITY_MODES:
        raise ValueError(
            f"security_mode must be one of {', '.join(SECURITY_MODES)}, "
            f"not {config.security_mode!r}"
        )
    for name in config.security_super_users:
        try:
            check_principal_name(name)
        except ValueError as error:
            raise ValueError(f"security_super_users: {error}") from None
    if config.broker_workers_per_dir < 1:
        raise ValueError("broker_workers_per_dir must be at least 1")
    if config.broker_advertised_port > 65535:
        raise ValueError(
            f"broker_advertised_port must be a TCP port (1 to 65535, 0: broker.port), not "
            f"{config.broker_advertised_port}"
        )
    for name in (
        "log_max_open_files",
        "broker_queued_request_bytes",
        "broker_queued_requests_per_client",
        "broker_queued_replies_per_client",
        "broker_queued_reply_bytes",
        "broker_queued_reply_bytes_per_client",
        "broker_fetch_max_bytes",
    ):
        value = config.values.get(name)
        if value is not None and value < 1:
            raise ValueError(f"{name} must be at least 1")


def topic_settings(raw: Mapping[str, str]) -> dict[str, SettingValue]:
    """A topic's own settings from their text form ("none" switches a limit off); InvalidTopic
    names anything unknown or out of its bounds (broker.log.config.BOUNDS) or choices
    (CHOICES). Whether they fit together is the caller's to check, with the broker's defaults
    for the rest (BrokerConfig.checked_log_config)."""
    out: dict[str, SettingValue] = {}
    for key, text in raw.items():
        if key not in TOPIC_SETTINGS and key not in REPLICA_SETTINGS:
            known = ", ".join((*TOPIC_SETTINGS, *REPLICA_SETTINGS))
            raise InvalidTopic(f"unknown topic setting {key!r}: one of {known}")
        if key in CHOICES:
            problem = choice_problem(key, text)
            if problem is not None:
                raise InvalidTopic(f"topic setting {problem}")
            out[key] = text
            continue
        if text == "none" and key in _OPTIONAL_TOPIC:
            out[key] = None
            continue
        # ASCII digits only, as docs/protocol.md says (parse_setting's rule too)
        if not _DIGITS.fullmatch(text) or int(text) > MAX_SETTING:
            raise InvalidTopic(
                f"topic setting {key} must be decimal digits 0-9 (at most {MAX_SETTING}), "
                f"not {text!r}"
            )
        problem = replica_problem(key, int(text)) if key in REPLICA_SETTINGS else None
        problem = problem or (bound_problem(key, int(text)) if key in TOPIC_SETTINGS else None)
        if problem is not None:
            raise InvalidTopic(f"topic setting {problem}")
        out[key] = int(text)
    return out


def replica_problem(name: str, value: int) -> str | None:
    """What is wrong with `value` for the replication setting `name`, or None."""
    low, high = REPLICA_SETTINGS[name]
    if not low <= value <= high:
        return f"{name} must be from {low} to {high}, not {value}"
    return None


def replica_setting(settings: Mapping[str, SettingValue], name: str) -> int:
    """A topic's replication setting `name`, its least value when the topic does not set it."""
    value = settings.get(name)
    return REPLICA_SETTINGS[name][0] if value is None else int(value)
