"""pylog-mirror's file: every key checked before anything is copied, errors that name the key;
the command exits 2 with the reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.mirror import MirrorConfig, MirrorConfigError

GOOD = """
[source]
bootstrap = "127.0.0.1:9092"
[target]
bootstrap = "127.0.0.1:19092"
[target.settings]
replication_factor = 3
retention_ms = "none"
[mirror]
topics = ["clicks", "logs-*"]
ack = "flushed"
"""


def load(tmp_path: Path, text: str) -> MirrorConfig:
    path = tmp_path / "mirror.toml"
    path.write_text(text)
    return MirrorConfig.load(path)


def test_a_good_file_loads_with_its_defaults(tmp_path: Path) -> None:
    config = load(tmp_path, GOOD)
    assert config.target_settings == {"replication_factor": "3", "retention_ms": "none"}
    assert config.mirror.ack == "flushed" and config.mirror.fetch_max_bytes == 1 << 20
    assert [config.mirror.mirrors(t) for t in ("clicks", "logs-web", "click", "logs")] == [
        True,
        True,
        False,
        False,
    ]
    assert config.source.keys is None and config.target.zookeeper_auth is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('ack = "flushed"', 'ack = "none"'), "ack: 'none' is not one of all, flushed"),
        (
            ('ack = "flushed"', 'fetch_max_bytes = "big"'),
            "fetch_max_bytes: 'big' is not an integer",
        ),
        (('ack = "flushed"', "acks = 1"), "[mirror] unknown key 'acks'"),
        (('topics = ["clicks", "logs-*"]', "topics = []"), "topics: name at least one"),
        (('retention_ms = "none"', 'compression = "gzip"'), "compression: a mirrored topic"),
        (('bootstrap = "127.0.0.1:9092"', 'bootstrap = ""'), "[source] bootstrap: give"),
        (
            ('bootstrap = "127.0.0.1:9092"', 'bootstrap = "a:1"\nkey_file = "k"'),
            "[source] key_file and broker_key go together",
        ),
        (("timeout_s", "timeout_s = 0\n#"), "timeout_s: must be above 0"),
    ],
)
def test_a_bad_setting_is_refused_naming_it(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    text = GOOD.replace(*change) if change[0] in GOOD else GOOD + f"{change[1]}\n"
    with pytest.raises(MirrorConfigError) as refused:
        load(tmp_path, text)
    assert message in str(refused.value) and str(tmp_path) in str(refused.value)


def test_missing_sections_and_unreadable_keys_are_refused(tmp_path: Path) -> None:
    with pytest.raises(MirrorConfigError, match=r"\[mirror\] is missing"):
        load(tmp_path, GOOD.split("[mirror]")[0])
    with pytest.raises(MirrorConfigError, match=r"no-such\.key_secret"):
        load(
            tmp_path,
            GOOD.replace(
                'bootstrap = "127.0.0.1:9092"',
                'bootstrap = "a:1"\nkey_file = "no-such.key_secret"\nbroker_key = "no-such.key"',
            ),
        )


@pytest.mark.broker
def test_the_command_exits_2_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "mirror.toml"
    path.write_text(GOOD.replace('ack = "flushed"', "ack = 3"))
    command = [str(Path(sys.executable).with_name("pylog-mirror")), "--config", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "[mirror] ack: 3 is not text" in result.stderr
