"""Live broker settings (broker.config.with_live, BrokerConfig.take_live, broker.registry.settings):
checked as the file's are, taken in place, the default entry under a broker's own."""

from __future__ import annotations

import pytest

from broker.config import LIVE_SETTINGS, BrokerConfig, load_config, setting_name, with_live
from broker.registry import Registry
from broker.registry.settings import DEFAULT, parse_broker_settings, settings_for


def test_live_settings_are_checked_as_the_file_is_and_taken_in_place() -> None:
    config = load_config(None, {"log_flush_interval_ms": "50"})
    holder = config  # another part of the process holding the same config
    live = with_live(config, {"log.flush_interval_ms": "200", "broker.log_level": "debug"})
    assert config.log_flush_interval_ms == 50  # not yet taken
    taken = config.take_live(live)
    assert taken == {"broker_log_level": "debug", "log_flush_interval_ms": 200}
    assert holder.log_flush_interval_ms == 200 and holder.broker_log_level == "debug"
    assert config.take_live(live) == {}  # nothing changed twice
    assert holder.log_config().flush_interval_ms == 200


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"broker.port": "1"}, "broker.port is read at start only"),
        ({"zookeeper.connect": "x:1"}, "zookeeper.connect is read at start only"),
        (
            {"log.flush_messages": "many"},
            "must be a whole number in decimal digits 0-9, not 'many'",
        ),
        # as topic settings are read (issue 50, 10): decimal digits 0-9 only, at most 2^63 - 1
        ({"broker.queued_reply_bytes": "1_000"}, "decimal digits 0-9"),
        ({"broker.queued_reply_bytes": " 1000"}, "decimal digits 0-9"),
        ({"broker.queued_reply_bytes": "+1000"}, "decimal digits 0-9"),
        ({"broker.queued_reply_bytes": "\u0661\u0662"}, "decimal digits 0-9"),
        ({"broker.queued_reply_bytes": "99999999999999999999999"}, "at most 9223372036854775807"),
        ({"log.segment_bytes": "10"}, "segment_bytes"),
        ({"broker.log_level": "loud"}, "must be one of debug, info, warning, error"),
        ({"flush_messages": "1"}, "unknown setting 'flush_messages'"),
        ({"log.nonsense": "1"}, "unknown setting 'log.nonsense'"),
    ],
)
def test_a_live_change_that_does_not_check_is_refused(changes: dict[str, str], reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        with_live(BrokerConfig(), changes)


def test_every_live_setting_has_a_dotted_name_that_comes_back() -> None:
    for name in LIVE_SETTINGS:
        dotted = setting_name(name)
        assert dotted.replace(".", "_", 1) == name
        default = getattr(BrokerConfig(), name)
        text = "none" if default is None else str(default).lower()
        with_live(BrokerConfig(), {dotted: text})  # each takes its default as text


def test_a_brokers_own_entry_wins_over_the_default() -> None:
    node = {DEFAULT: {"log.retention_ms": "1", "log.segment_ms": "2"}, "3": {"log.segment_ms": "9"}}
    assert settings_for(node, 3) == {"log.retention_ms": "1", "log.segment_ms": "9"}
    assert settings_for(node, 4) == {"log.retention_ms": "1", "log.segment_ms": "2"}
    with pytest.raises(ValueError, match="neither 'default' nor a broker id"):
        parse_broker_settings(b'{"version": 1, "brokers": {"all": {}}}')


def test_the_registry_keeps_each_entry_and_refuses_what_does_not_check(
    registry: Registry,
) -> None:
    assert registry.settings.read() == {}
    assert registry.settings.set(DEFAULT, {"log.retention_ms": "5000"}) == {
        "log.retention_ms": "5000"
    }
    registry.settings.set("2", {"broker.log_level": "debug"})
    registry.settings.set(DEFAULT, {"log.segment_ms": "none"})
    assert registry.settings.read() == {
        DEFAULT: {"log.retention_ms": "5000", "log.segment_ms": "none"},
        "2": {"broker.log_level": "debug"},
    }
    with pytest.raises(ValueError, match="read at start only"):
        registry.settings.set("2", {"broker.port": "1"})
    assert registry.settings.delete(DEFAULT, ("log.segment_ms",)) == {"log.retention_ms": "5000"}
    with pytest.raises(KeyError, match=r"log\.segment_ms"):
        registry.settings.delete(DEFAULT, ("log.segment_ms",))
    assert registry.settings.delete("2", ()) == {}
    assert registry.settings.read() == {DEFAULT: {"log.retention_ms": "5000"}}
