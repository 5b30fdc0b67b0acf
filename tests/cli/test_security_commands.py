"""`pylogctl keys`, `principal` and `acl` against a real ZooKeeper (no broker needed with
--zookeeper): what an operator types, including the mistakes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from broker.security import load_public_key
from broker.zookeeper import PrivateZooKeeper
from cli.pylogctl import cli

Run = Callable[..., Result]


@pytest.fixture
def run(zookeeper: PrivateZooKeeper, registry_chroot: str, tmp_path: Path) -> Run:
    """pylogctl with the given arguments, in tmp_path, on this test's registry."""

    def invoke(*args: str, registry: bool = True) -> Result:
        where = ["--zookeeper", zookeeper.connect_string, "--chroot", registry_chroot]
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(tmp_path)
            return CliRunner().invoke(cli, [*args, *(where if registry else [])])

    return invoke


def test_keys_generate_writes_a_pair_once(run: Run, tmp_path: Path) -> None:
    made = run("keys", "generate", "alice", registry=False)
    assert made.exit_code == 0, made.output
    public = load_public_key(tmp_path / "alice.key").decode()
    assert public in made.output
    assert (tmp_path / "alice.key_secret").stat().st_mode & 0o777 == 0o600
    assert run("keys", "show", "alice.key", registry=False).output.strip() == public
    again = run("keys", "generate", "alice", registry=False)
    assert again.exit_code == 2 and "never overwritten" in again.output


def test_principals_and_acls_round_trip_with_clear_refusals(run: Run) -> None:
    for name in ("alice", "bob"):
        assert run("keys", "generate", name, registry=False).exit_code == 0
    assert run("principal", "add", "alice", "alice.key").exit_code == 0
    secret = run("principal", "add", "alice", "alice.key_secret")
    assert secret.exit_code == 2 and "never the secret" in secret.output
    taken = run("principal", "add", "bob", "alice.key")
    assert taken.exit_code == 1 and "already principal 'alice'" in taken.output
    listed = run("principal", "list", "--json")
    assert [json.loads(line)["principal"] for line in listed.output.splitlines()] == ["alice"]

    def acl(verb: str, topic: str, *operations: str) -> Result:
        options = [a for o in operations for a in ("--operation", o)]
        return run("acl", verb, "--principal", "alice", "--topic", topic, *options)

    assert acl("add", "logs.*", "fetch").exit_code == 0
    merged = acl("add", "logs.*", "produce")
    assert "alice may fetch,produce on logs.*" in merged.output
    bad = acl("add", "lo*gs", "fetch")
    assert bad.exit_code == 2 and "prefix ending in *" in bad.output
    unknown = acl("add", "x", "read")
    assert unknown.exit_code == 2
    left = acl("remove", "logs.*", "fetch")
    assert "alice may produce on logs.*" in left.output
    assert json.loads(run("acl", "list", "--json").output) == {
        "principal": "alice",
        "resource": "logs.*",
        "operations": ["produce"],
    }
    assert acl("remove", "logs.*").exit_code == 0
    missing = acl("remove", "logs.*")
    assert missing.exit_code == 1 and "no ACL of alice" in missing.output
    assert run("principal", "remove", "alice").exit_code == 0
    gone = run("principal", "remove", "alice")
    assert gone.exit_code == 1 and "no principal 'alice'" in gone.output
