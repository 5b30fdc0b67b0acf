"""pylogctl's --key-file and --broker-key (issue 16): a real pylogd in curve mode
(tests/curve.py) serves commands with them, not without; one without the other, or a secret
file that others may read, is one line and exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.security import generate_keys
from cli.pylogctl import cli
from tests.conftest import wait_until
from tests.curve import SUPER_USER, CurveBroker, curve_broker_fixture

curve_broker = curve_broker_fixture()


def run(*args: str, input: bytes | None = None, **env: str) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, env=env)


def test_commands_reach_a_curve_broker_with_the_keys_and_not_without(
    curve_broker: CurveBroker, topic: str
) -> None:
    endpoint, key_dir = curve_broker.broker.endpoint, curve_broker.key_dir
    secret, public = key_dir / f"{SUPER_USER}.key_secret", key_dir / "broker.key"
    accepted = curve_broker.counted("pylog_connections_accepted_total")
    options = ("--key-file", str(secret), "--broker-key", str(public))
    created = run(*options, "topic", "create", topic, PYLOG_BROKER=endpoint)
    assert created.exit_code == 0, created.output
    produced = run(*options, "produce", topic, input=b"a\nb\n", PYLOG_BROKER=endpoint)
    assert produced.output == "2 messages acknowledged (flushed)\n"
    # The environment gives them too, and the broker key as its 40 characters.
    consumed = run(
        "consume",
        topic,
        "--until",
        "end",
        PYLOG_BROKER=endpoint,
        PYLOG_KEY_FILE=str(secret),
        PYLOG_BROKER_KEY=curve_broker.keys(SUPER_USER).broker.decode(),
    )
    assert consumed.exit_code == 0, consumed.output
    assert consumed.stdout == "a\nb\n"
    # After the command, and one before it with the other after it (issue 30).
    after = run("topic", "list", *options, PYLOG_BROKER=endpoint)
    assert after.exit_code == 0 and topic in after.stdout.splitlines(), after.output
    split = run(*options[:2], "topic", "list", *options[2:], "-b", endpoint)
    assert split.exit_code == 0 and topic in split.stdout.splitlines(), split.output
    assert curve_broker.counted("pylog_connections_accepted_total") > accepted
    assert curve_broker.counted("pylog_connections_refused_total") == 0

    failed = curve_broker.counted("pylog_handshakes_failed_total")
    plaintext = run("topic", "list", "--timeout", "0.5", PYLOG_BROKER=endpoint)
    assert plaintext.exit_code == 1
    assert plaintext.stderr.startswith(
        f"pylogctl: AuthenticationFailed: the broker at {endpoint} serves CurveZMQ"
    )
    wait_until(
        lambda: curve_broker.counted("pylog_handshakes_failed_total") > failed,
        what="the plaintext handshake counted",
    )


@pytest.mark.parametrize(
    ("given", "missing"), [("--key-file", "--broker-key"), ("--broker-key", "--key-file")]
)
def test_one_key_option_without_the_other_is_a_usage_error(
    tmp_path: Path, given: str, missing: str
) -> None:
    result = run(given, str(tmp_path / "any"), "topic", "list")
    assert result.exit_code == 2
    assert result.stderr == (
        f"pylogctl: {given} needs {missing} too: a Curve client presents its own key pair "
        "and checks the broker's public key\n"
    )
    from_env = run("topic", "list", PYLOG_KEY_FILE=str(tmp_path / "any"))
    assert from_env.exit_code == 2 and from_env.stderr.count("\n") == 1


def test_a_secret_file_others_may_read_is_refused_in_one_line(tmp_path: Path) -> None:
    public, secret = generate_keys(tmp_path, "client")
    os.chmod(secret, 0o644)
    result = run("--key-file", str(secret), "--broker-key", str(public), "topic", "list")
    assert result.exit_code == 2
    assert result.stderr == (
        f"pylogctl: {secret} may be read by others (mode 0644): run chmod 600 {secret}\n"
    )
    absent = tmp_path / "none.key_secret"
    missing = run("--key-file", str(absent), "--broker-key", str(public), "topic", "list")
    assert missing.exit_code == 2
    assert missing.stderr.startswith(f"pylogctl: {absent}: ") and missing.stderr.count("\n") == 1


def test_help_shows_the_key_options() -> None:
    shown = run("--help").output
    assert "--key-file PATH" in shown and "PYLOG_KEY_FILE" in shown
    assert "--broker-key KEY|PATH" in shown and "PYLOG_BROKER_KEY" in shown


def test_the_spark_jobs_take_pylogctls_key_options_as_their_own(tmp_path: Path) -> None:
    absent = tmp_path / "none.key_secret"
    options = ("--key-file", str(absent), "--broker-key", str(tmp_path / "broker.key"))
    window = ("--start", "2026-11-22", "--end", "2026-11-23")
    for job, *args in (("load",), ("audit", *window)):
        result = run(*options, job, "--topic", "t", "--output", str(tmp_path), *args)
        assert result.exit_code == 2, result.output
        assert f"Error: {absent}: " in result.output  # read before Spark starts


def test_a_zookeeper_auth_file_others_may_read_is_refused_in_one_line(tmp_path: Path) -> None:
    auth = tmp_path / "loaders.auth"
    auth.write_text("loaders:secret\n")
    os.chmod(auth, 0o644)
    result = run("group", "list", "--zookeeper", "127.0.0.1:9", "--zookeeper-auth-file", str(auth))
    assert result.exit_code == 2
    assert result.stderr == (
        f"pylogctl: --zookeeper-auth-file: {auth} may be read by others (mode 0644): "
        f"run chmod 600 {auth}\n"
    )


def test_broker_json_and_keys_are_taken_before_or_after_the_command_the_commands_winning(
    tmp_path: Path,
) -> None:
    """--broker (-b) before the command beats $PYLOG_BROKER; after it, it beats the one
    before; --json before the command turns the command's on (issue 30). Unreachable
    addresses: the error names the one used."""
    quick = ("--timeout", "0.2")

    def used(*args: str) -> str:
        result = run(*args, PYLOG_BROKER="127.0.0.1:1")
        assert result.exit_code == 1, result.output
        return result.stderr.split()[2]  # "pylogctl: broker tcp://... unreachable: ..."

    assert used("topic", "list", *quick) == "tcp://127.0.0.1:1"
    assert used("-b", "127.0.0.1:2", "topic", "list", *quick) == "tcp://127.0.0.1:2"
    assert used("--broker", "127.0.0.1:2", "topic", "list", *quick) == "tcp://127.0.0.1:2"
    assert used("-b", "127.0.0.1:2", "topic", "list", "-b", "127.0.0.1:3", *quick) == (
        "tcp://127.0.0.1:3"
    )
    assert used("group", "list", "-b", "127.0.0.1:4", *quick) == "tcp://127.0.0.1:4"
    bad = run("-b", "127.0.0.1:notaport", "topic", "list")
    assert bad.exit_code == 2 and bad.stderr.startswith("pylogctl: --broker '127.0.0.1:notaport'")
    # A key option after the command still needs the other, wherever that one is.
    lone = run("topic", "list", "--key-file", str(tmp_path / "any"))
    assert lone.exit_code == 2 and "--key-file needs --broker-key too" in lone.stderr
