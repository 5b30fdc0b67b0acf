"""The quotas' arithmetic and the order of held requests (broker.quotas), on a fake clock."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import zmq

from broker.errors import RepliesNotRead
from broker.quotas import (
    DEFAULT,
    MAX_CLIENTS,
    MAX_NAME,
    WINDOW_S,
    Direction,
    Kind,
    Quota,
    QuotaConfig,
    Throttle,
    describe_quotas,
)
from broker.transport import connection_of, throttle_of, throttled

PRODUCE, FETCH = Direction.PRODUCE, Direction.FETCH
ALICE = (Kind.CLIENT, "alice")
CONNECTION = b"R\x00\x01"
CEILING = 4000
"""The test throttles' ceiling of request bytes held back: a client's share is 1000."""


def request(name: bytes) -> list[zmq.Frame]:
    """A request's frames as the front received them."""
    return [zmq.Frame(name)]


def names(held: Iterable[tuple[Any, ...]]) -> list[bytes]:
    """The first frame of each held request (the frames item of each tuple)."""
    return [frames[0].bytes for frames in (item[1] for item in held)]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def throttle_of_config(clock: FakeClock, **quotas: Quota) -> Throttle:
    throttle = Throttle(parked_per_client=4, held_ceiling=CEILING, clock=clock)
    throttle.update(QuotaConfig({Kind.CLIENT: quotas}))
    list(throttle.due())  # the configuration is taken on a turn
    return throttle


def test_no_quota_set_is_inactive_and_admits_everything() -> None:
    clock = FakeClock()
    throttle = throttle_of_config(clock)
    assert not throttle.active
    assert throttle.admit(CONNECTION, ALICE, PRODUCE, 10**9, None) == 0
    assert throttle.admit(CONNECTION, ALICE, PRODUCE, 10**9, None) == 0


def test_a_client_may_run_one_window_ahead_then_waits_what_it_owes_over_it() -> None:
    clock = FakeClock()
    throttle = throttle_of_config(clock, alice=Quota(produce_bytes_per_s=1000))
    assert throttle.active
    # 1000 B/s, a window of 1 s: requests pass while alice owes no more than 1000 bytes
    assert throttle.admit(CONNECTION, ALICE, PRODUCE, 600, None) == 0
    assert throttle.admit(CONNECTION, ALICE, PRODUCE, 600, None) == 0  # owed 600 <= 1000
    wait = throttle.admit(CONNECTION, ALICE, PRODUCE, 600, None)  # owes 1200: 0.2 s over
    assert wait == pytest.approx(0.2)
    clock.now += wait
    assert throttle.admit(CONNECTION, ALICE, PRODUCE, 600, None) == 0
    # Over a long run from idle, what passes is the quota's rate plus one window.
    clock.now += 10  # owes nothing now
    sent, start = 0, clock.now
    while clock.now - start < 60:
        wait = throttle.admit(CONNECTION, ALICE, PRODUCE, 100, None)
        if wait:
            clock.now += wait
        else:
            sent += 100
    assert (60 + WINDOW_S) * 1000 <= sent <= (60 + WINDOW_S) * 1000 + 100


def test_quotas_resolve_per_direction_override_then_default() -> None:
    config = QuotaConfig(
        {
            Kind.CLIENT: {
                DEFAULT: Quota(produce_bytes_per_s=10, fetch_bytes_per_s=20),
                "alice": Quota(produce_bytes_per_s=5),
            },
            Kind.PRINCIPAL: {"bob": Quota(fetch_bytes_per_s=7)},
        }
    )
    assert config.rate(Kind.CLIENT, "alice", PRODUCE) == 5
    assert config.rate(Kind.CLIENT, "alice", FETCH) == 20  # the default's
    assert config.rate(Kind.CLIENT, "carol", PRODUCE) == 10
    assert config.rate(Kind.PRINCIPAL, "bob", FETCH) == 7
    assert config.rate(Kind.PRINCIPAL, "bob", PRODUCE) is None
    assert config.rate(Kind.PRINCIPAL, "carol", FETCH) is None
    assert "client alice produce 5 fetch - B/s" in describe_quotas(config)
    assert describe_quotas(QuotaConfig()) == "none"


@pytest.mark.parametrize("rate", [0, -1, 1.5, True, 2**41, "100"])
def test_a_quota_is_a_whole_number_of_bytes_a_second(rate: Any) -> None:
    with pytest.raises(ValueError, match="produce_bytes_per_s"):
        Quota(produce_bytes_per_s=rate)


def test_fetch_replies_count_to_the_connection_that_fetched() -> None:
    clock = FakeClock()
    throttle = throttle_of_config(clock, alice=Quota(fetch_bytes_per_s=1000))
    assert throttle.admit(CONNECTION, ALICE, FETCH, 0, None) == 0
    throttle.fetched(throttled(CONNECTION, 5), 3000)  # the reply's tag may carry a throttle
    assert throttle.admit(CONNECTION, ALICE, FETCH, 0, None) == pytest.approx(2.0)
    throttle.fetched(b"R\x00\x02", 10**9)  # another connection's: no client of a quota
    (stats,) = throttle.statistics().clients
    assert (stats.kind, stats.name, stats.fetch_bytes, stats.fetch_quota) == (
        Kind.CLIENT,
        "alice",
        3000,
        1000,
    )


def test_held_requests_come_back_in_order_when_due_and_count_their_wait() -> None:
    clock = FakeClock()
    throttle = throttle_of_config(clock, alice=Quota(produce_bytes_per_s=1000))
    throttle.admit(CONNECTION, ALICE, PRODUCE, 3000, None)  # owes 3000: 2 s over
    wait = throttle.admit(CONNECTION, ALICE, PRODUCE, 10, None)
    assert wait == pytest.approx(2.0)
    throttle.hold(CONNECTION, request(b"first"), clock.now, wait, ALICE)
    throttle.hold(CONNECTION, request(b"second"), clock.now, 0.0)  # behind it, any api
    assert CONNECTION in throttle.held and throttle.held_requests == 2
    assert throttle.timeout_ms(100) == 100
    clock.now += 1.95
    assert throttle.timeout_ms(100) == 50
    assert list(throttle.due()) == []
    clock.now += 0.05
    arrived = clock.now - 2.0
    due = list(throttle.due())
    assert names(due) == [b"first", b"second"]
    assert {(tagged, at) for tagged, _, at in due} == {(CONNECTION, arrived)}
    assert not throttle.held and throttle.held_requests == 0
    assert throttle.admit(CONNECTION, ALICE, PRODUCE, 10, arrived) == 0
    (stats,) = throttle.statistics().clients
    assert stats.produce_throttled_s == pytest.approx(2.0)


def test_a_request_held_again_stops_its_connection_until_its_new_wait() -> None:
    clock = FakeClock()
    throttle = throttle_of_config(clock, alice=Quota(produce_bytes_per_s=1000))
    throttle.hold(CONNECTION, request(b"a"), clock.now, 1.0, ALICE)
    throttle.hold(CONNECTION, request(b"b"), clock.now, 0.0)
    clock.now += 1.0
    due = throttle.due()
    tagged, frames, arrived = next(due)
    throttle.hold(tagged, frames, arrived, 0.5, ALICE, again=True)  # alice still over: first
    assert list(due) == []
    held = throttle.held[CONNECTION].requests
    assert names((None, frames) for frames, _ in held) == [b"a", b"b"]


def test_a_connection_holds_at_most_its_share_of_requests() -> None:
    clock = FakeClock()
    throttle = throttle_of_config(clock, alice=Quota(produce_bytes_per_s=1000))
    throttle.hold(CONNECTION, request(b"0"), clock.now, 1.0, ALICE)
    for i in range(1, 4):
        throttle.hold(CONNECTION, request(bytes([i])), clock.now, 0.0)
    with pytest.raises(RepliesNotRead, match="4 requests held back for its quota"):
        throttle.hold(CONNECTION, request(b"4"), clock.now, 0.0)


def test_held_requests_are_bounded_in_bytes_per_client_and_in_all() -> None:
    """Issue 50, 2: 40 connections pipelining 512 KiB PRODUCEs under a small quota took the
    supervisor to 1.3 GiB. A client holds at most a quarter of the ceiling in bytes over all
    its connections, all clients the ceiling; one holding nothing while nothing is held may
    hold one request of any size; bytes given back by `due` make room again."""
    clock = FakeClock()
    throttle = throttle_of_config(clock, alice=Quota(produce_bytes_per_s=1000))
    big = [zmq.Frame(bytes(600))]
    throttle.hold(CONNECTION, big, clock.now, 1.0, ALICE)  # 600 of alice's 1000
    other = b"R\x00\x02"  # alice's other connection: her share counts over both
    with pytest.raises(RepliesNotRead, match="600 bytes of this client's requests"):
        throttle.hold(other, big, clock.now, 1.0, ALICE)
    assert other not in throttle.held and throttle.held_bytes == 600
    for n, name in enumerate(("bob", "carol", "dave")):  # 600 each: the ceiling then
        client = (Kind.CLIENT, name)
        connection = bytes([82, 1, n])
        if n < 2:
            throttle.hold(connection, big, clock.now, 1.0, client)
        else:
            with pytest.raises(RepliesNotRead, match="the broker holds 1800 bytes of requests"):
                throttle.hold(connection, [zmq.Frame(bytes(2300))], clock.now, 1.0, client)
    assert throttle.held_bytes == 1800
    clock.now += 1.0
    assert len(list(throttle.due())) == 3
    assert throttle.held_bytes == 0 and throttle.held_requests == 0
    throttle.hold(CONNECTION, [zmq.Frame(bytes(CEILING * 2))], clock.now, 1.0, ALICE)  # alone


def test_what_a_closed_connection_held_is_dropped() -> None:
    """Issue 50, 2: held requests outlived their connection (appended 45 s after the client
    had gone). The TCP connection's close (its descriptor, from the front socket's monitor)
    drops what it held; other connections keep theirs."""
    clock = FakeClock()
    throttle = throttle_of_config(clock, alice=Quota(produce_bytes_per_s=1000))
    other = b"R\x00\x02"
    throttle.hold(CONNECTION, request(b"a"), clock.now, 1.0, ALICE, fd=7)
    throttle.hold(CONNECTION, request(b"b"), clock.now, 0.0)
    throttle.hold(other, request(b"c"), clock.now, 1.0, ALICE, fd=8)
    assert throttle.closed(-1) == 0  # no descriptor known: nothing
    assert throttle.closed(7) == 2
    assert list(throttle.held) == [other] and throttle.held_requests == 1
    assert throttle.held_bytes == 1
    clock.now += 1.0
    assert names(throttle.due()) == [b"c"]


def test_a_quota_changed_applies_to_what_is_owed_and_releases_what_waits() -> None:
    clock = FakeClock()
    throttle = throttle_of_config(clock, alice=Quota(produce_bytes_per_s=1000))
    throttle.admit(CONNECTION, ALICE, PRODUCE, 11_000, None)  # owes 11 s of its quota
    throttle.hold(CONNECTION, request(b"x"), clock.now, 10.0, ALICE)
    throttle.update(QuotaConfig({Kind.CLIENT: {"alice": Quota(produce_bytes_per_s=100_000)}}))
    assert names(throttle.due()) == [b"x"]  # looked at again at once
    assert throttle.admit(CONNECTION, ALICE, PRODUCE, 10, None) == 0  # 11,000 < 100,000
    throttle.update(QuotaConfig())
    list(throttle.due())
    assert not throttle.active
    assert throttle.statistics().clients[0].produce_quota is None


def test_clients_idle_and_owing_nothing_are_forgotten() -> None:
    clock = FakeClock()
    throttle = throttle_of_config(clock, alice=Quota(fetch_bytes_per_s=1000))
    throttle.admit(CONNECTION, ALICE, FETCH, 0, None)
    throttle.fetched(CONNECTION, 10_000)
    clock.now += 301  # owes nothing after 10 s; idle for longer than FORGET_AFTER_S
    list(throttle.due())
    assert throttle.statistics().clients == ()
    throttle.fetched(CONNECTION, 10)  # its connection is forgotten too: nothing to count to
    assert throttle.statistics().clients == ()


def test_the_clients_counted_are_bounded_in_number_and_name_length() -> None:
    """Issue 50, 3: 20,000 made-up client ids took +204 MiB for 300 s. Past MAX_CLIENTS, a
    client without a quota of its own is counted with every other such one, under DEFAULT's
    name, at the default quota; one with its own is still counted apart; a long id is counted
    under its first MAX_NAME characters."""
    clock = FakeClock()
    throttle = throttle_of_config(
        clock, **{DEFAULT: Quota(produce_bytes_per_s=10_000), "alice": Quota(1000)}
    )
    for n in range(MAX_CLIENTS + 2000):
        assert throttle.admit(CONNECTION, (Kind.CLIENT, f"made-up-{n}"), PRODUCE, 1, None) == 0
    counted = {c.name: c for c in throttle.statistics().clients}
    assert len(counted) == MAX_CLIENTS + 1
    assert counted[DEFAULT].produce_bytes == 2000  # the overflow, counted together
    throttle.admit(CONNECTION, ALICE, PRODUCE, 1, None)  # her own quota: her own count
    assert "alice" in {c.name for c in throttle.statistics().clients}
    for n in range(30):  # together, they owe the default's window: then they wait
        throttle.admit(CONNECTION, (Kind.CLIENT, f"more-{n}"), PRODUCE, 1000, None)
    assert throttle.admit(CONNECTION, (Kind.CLIENT, "yet-another"), PRODUCE, 1, None) > 0
    clock.now += 301
    list(throttle.due())  # forgotten once idle: room again
    long = "x" * 5000
    throttle.admit(CONNECTION, (Kind.CLIENT, long), PRODUCE, 1, None)
    assert [c.name for c in throttle.statistics().clients] == ["x" * MAX_NAME]


def test_a_throttle_travels_in_the_tagged_identity() -> None:
    for tagged in (b"R\x00\x01\x02", b"Q\xff"):
        marked = throttled(tagged, 250)
        assert throttle_of(marked) == 250 and connection_of(marked) == tagged
        assert throttle_of(tagged) == 0 and connection_of(tagged) == tagged
    assert throttle_of(throttled(b"R1", 2**40)) == 2**32 - 1
