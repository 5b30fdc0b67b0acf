"""The parts of security that decide, without sockets: ACL rules, the Authorizer and its cache,
principals files, and the ZAP handler's answers to what ZeroMQ may send it."""

from __future__ import annotations

from pathlib import Path

import pytest
import zmq
from zmq.utils import z85

from broker.errors import AuthorizationFailed
from broker.security import (
    Acl,
    Authorizer,
    Operation,
    Principals,
    ZapHandler,
    check_resource,
    parse_operations,
    read_principals_file,
)

KEY_A = zmq.curve_keypair()[0]
KEY_B = zmq.curve_keypair()[0]


def test_an_acl_names_a_topic_a_prefix_or_every_topic() -> None:
    exact = Acl("web", "clicks", frozenset({Operation.PRODUCE}))
    assert exact.matches("clicks") and not exact.matches("clicks2")
    prefix = Acl("web", "logs.*", frozenset({Operation.FETCH}))
    assert prefix.matches("logs.web") and prefix.matches("logs.") and not prefix.matches("logs")
    every = Acl("web", "*", frozenset({Operation.ALTER}))
    assert every.matches("anything")
    assert every.grants(Operation.DESCRIBE) and not every.grants(Operation.DELETE)


@pytest.mark.parametrize("resource", ["", "a/b", "lo*gs", "**", "."])
def test_a_bad_resource_is_refused(resource: str) -> None:
    with pytest.raises(ValueError, match="resource"):
        check_resource(resource)


def test_operations_are_named_and_all_means_every_one() -> None:
    assert parse_operations(["all"]) == frozenset(Operation)
    with pytest.raises(ValueError, match="unknown operation 'read'"):
        parse_operations(["read"])
    with pytest.raises(ValueError, match="at least one"):
        parse_operations([])


def test_the_authorizer_decides_from_the_latest_acls_only() -> None:
    authorizer = Authorizer(["ops"])
    assert authorizer.allowed("ops", Operation.DELETE, "clicks")  # a super user
    assert not authorizer.allowed("web", Operation.PRODUCE, "clicks")  # cached as denied
    authorizer.update([Acl("web", "click*", frozenset({Operation.PRODUCE}))])
    assert authorizer.allowed("web", Operation.PRODUCE, "clicks")  # the cache went with them
    assert authorizer.allowed("web", Operation.DESCRIBE, "clicks")
    assert not authorizer.allowed("web", Operation.FETCH, "clicks")
    with pytest.raises(AuthorizationFailed) as denied:
        authorizer.check("web", Operation.FETCH, "clicks")
    assert (denied.value.operation, denied.value.resource) == ("fetch", "clicks")
    assert authorizer.denied == 1
    authorizer.update([])
    assert not authorizer.allowed("web", Operation.PRODUCE, "clicks")


def test_a_principals_file_takes_keys_with_hashes_and_refuses_what_it_cannot_read(
    tmp_path: Path,
) -> None:
    # "#" is a Z85 character: a key may hold one, and it is no comment there
    key = next(k for k, _ in (zmq.curve_keypair() for _ in range(1000)) if b"#" in k)
    path = tmp_path / "principals"
    path.write_text(f"# the web tier\nweb {key.decode()}\n\nweb {KEY_B.decode()}\n")
    assert read_principals_file(path) == {key.decode(): "web", KEY_B.decode(): "web"}
    for text, problem in (
        ("web\n", "write NAME KEY"),
        (f"web {KEY_A.decode()}\napp {KEY_A.decode()}\n", "given twice"),
        ("web notakey\n", "not a Curve key"),
        (f"w/b {KEY_A.decode()}\n", "principal name"),
    ):
        path.write_text(text)
        with pytest.raises(ValueError, match=problem):
            read_principals_file(path)


def test_the_zap_handler_lets_in_known_curve_keys_only() -> None:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    principals = Principals(None)
    principals.from_registry({"web": (KEY_A,)})
    handler = ZapHandler(context, principals)
    try:

        def answer(*frames: bytes) -> list[bytes]:
            return handler._answer(list(frames))

        request = [b"1.0", b"7", b"pylog", b"10.0.0.1", b""]
        # the User-Id is the key: each request looks it up (a key removed stops its requests)
        assert answer(*request, b"CURVE", z85.decode(KEY_A))[2:5] == [b"200", b"OK", KEY_A]
        refused = answer(*request, b"CURVE", z85.decode(KEY_B))
        assert refused[2] == b"400" and b"unknown client key" in refused[3]
        assert answer(*request, b"NULL")[2] == b"400"
        assert answer(b"2.0", b"7")[2] == b"500"
        assert (handler.accepted, handler.refused) == (1, 2)
    finally:
        handler.close()
        context.term()
