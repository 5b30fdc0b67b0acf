"""broker.config: the settings table and the types BrokerConfig gives its values."""

from __future__ import annotations

import pytest

from broker.config import SETTINGS, BrokerConfig, Setting, SettingTypes

KINDS = {int: "int", str: "str", bool: "bool", list: "list[str]"}


def test_every_setting_has_its_type_and_every_type_its_setting() -> None:
    declared = dict(SettingTypes.__annotations__)
    expected = {s.name: KINDS[s.kind] + (" | None" if s.optional else "") for s in SETTINGS}
    assert declared == expected


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: s.name)
def test_a_default_is_of_its_settings_type(setting: Setting) -> None:
    value = getattr(BrokerConfig(), setting.name)
    assert isinstance(value, setting.kind) or (value is None and setting.optional)


def test_a_name_that_is_no_setting_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="log_flush_message"):
        getattr(BrokerConfig(), "log_flush_message")  # noqa: B009
