"""The rules of a partition's replication on one broker (broker.replication.replica;
docs/replication.md, "The leader" and "Fencing"), on the Replica alone: no broker, no socket, no
disk; time is a number."""

from __future__ import annotations

import pytest

from broker import protocol
from broker.control import PartitionRole
from broker.errors import NotEnoughReplicas, NotLeaderForPartition
from broker.replication.lease import Lease
from broker.replication.replica import PendingAck, Replica, Reply

ME = 1
INCARNATION = 41
LAG_S = 10.0


def role(
    leader: int = ME,
    epoch: int = 3,
    *,
    incarnation: int = INCARNATION,
    isr: tuple[int, ...] = (1, 2, 3),
    version: int = 0,
    min_insync: int = 2,
) -> PartitionRole:
    endpoint = None if leader < 0 else f"tcp://127.0.0.1:{9090 + leader}"
    return PartitionRole(
        "clicks", 0, leader, epoch, incarnation, isr, (1, 2, 3), endpoint, None, min_insync, version
    )


def leased(until: float = 100.0) -> Replica:
    return Replica("clicks-0", ME, Lease(until, INCARNATION))


def leading(replica: Replica, now: float = 0.0, flushed: int = 0) -> list[Reply]:
    """`replica` leading in role()'s term from `flushed`: the replies its adoption made."""
    adoption, replies = replica.adopt(role(), False, now)
    assert adoption == "lead"
    replica.start_term(flushed, flushed, LAG_S, now)
    return replies


def ack(end: int, correlation_id: int) -> PendingAck:
    return PendingAck(end, correlation_id, (b"client", b"ack-%d" % correlation_id))


def codes(replies: list[Reply]) -> list[str]:
    return [
        protocol.ErrorCode(protocol.decode_reply_header([frame]).error_code).name
        for _, frame in replies
    ]


def test_a_partition_of_one_replica_is_served_without_a_role_or_a_lease() -> None:
    replica = Replica("clicks-0", ME, Lease())
    replica.check_serving(now=1e9)  # nothing raised
    assert replica.high_watermark(flushed=500) == 500


def test_a_follower_tells_the_high_watermark_the_leader_sent_within_its_flushed_bytes() -> None:
    """What DESCRIBE_PARTITION and the high watermark gauge report on a follower."""
    replica = leased()
    assert replica.adopt(role(leader=2), False, 0.0) == ("follow", [])
    replica.high_watermark_seen = 40
    assert replica.high_watermark(flushed=100) == 40  # flushed here, not yet replicated
    assert replica.high_watermark(flushed=30) == 30  # not yet copied here


def test_a_replicated_partition_is_served_only_by_its_leader_under_the_lease() -> None:
    replica = leased(until=100.0)
    assert replica.adopt(role(leader=2), False, 0.0) == ("follow", [])
    with pytest.raises(NotLeaderForPartition) as follower:
        replica.check_serving(0.0)
    assert (follower.value.leader, follower.value.leader_epoch) == (2, 3)
    leading(replica)
    replica.check_serving(99.9)
    with pytest.raises(NotLeaderForPartition) as lapsed:  # the lease ran out: maybe replaced
        replica.check_serving(100.0)
    assert lapsed.value.leader == -1


def test_a_role_given_to_an_earlier_incarnation_of_this_broker_is_not_taken() -> None:
    replica = leased()
    assert replica.adopt(role(incarnation=INCARNATION - 1), False, 0.0) == ("none", [])
    assert replica.leader is None
    with pytest.raises(NotLeaderForPartition):
        replica.check_serving(0.0)
    # the same broker chosen again, in this incarnation, in a new epoch
    assert replica.adopt(role(epoch=4), False, 0.0) == ("lead", [])


def test_a_lease_for_another_incarnation_does_not_cover_a_term_of_the_old_one() -> None:
    replica = leased()
    leading(replica)
    replica.lease.broker_epoch = INCARNATION + 1  # restarted within the session
    with pytest.raises(NotLeaderForPartition) as raised:
        replica.check_serving(0.0)
    assert raised.value.leader == -1


def test_acks_that_come_due_while_the_leader_may_have_been_replaced_are_failed() -> None:
    replica = leased(until=100.0)
    leading(replica)
    replica.acks.extend([ack(10, 1), ack(20, 2)])
    replies = replica.answer_flushed(10, now=50.0)
    assert replies == [(b"client", b"ack-1")] and len(replica.acks) == 1
    replies = replica.answer_flushed(20, now=150.0)  # the lease ran out
    assert codes(replies) == ["NOT_LEADER_FOR_PARTITION"] and not replica.acks


def test_ack_all_is_answered_when_the_high_watermark_covers_it_and_never_when_fenced() -> None:
    replica = leased(until=100.0)
    leading(replica)
    leader = replica.leader
    assert leader is not None
    replica.all_acks.extend([ack(10, 1), ack(30, 2)])
    for follower in (2, 3):
        leader.record_fetch(follower, 10, 10, 30, now=1.0)
    high_watermark, replies = replica.answer_high_watermark(30, 1.0)
    assert high_watermark == 10  # the lowest flushed offset in the ISR
    assert replies == [(b"client", b"ack-1")]
    assert replica.high_watermark_seen == 10
    for follower in (2, 3):
        leader.record_fetch(follower, 30, 30, 30, now=150.0)
    high_watermark, replies = replica.answer_high_watermark(30, 150.0)
    assert high_watermark == 30
    assert codes(replies) == ["NOT_LEADER_FOR_PARTITION"]  # the lease ran out at 100


def test_a_term_starts_its_high_watermark_at_the_one_seen_before_but_not_past_the_log() -> None:
    replica = leased()
    replica.high_watermark_seen = 6922  # from the checkpoint, after a restart
    assert replica.adopt(role(), False, 0.0) == ("lead", [])
    assert replica.start_term(7000, 7000, LAG_S, 0.0).high_watermark == 6922
    other = leased()
    other.high_watermark_seen = 6922
    other.adopt(role(), False, 0.0)
    assert other.start_term(5000, 5000, LAG_S, 0.0).high_watermark == 5000


def test_a_log_started_past_the_high_watermark_raises_it_there() -> None:
    """An empty log asked to start at a mirrored partition's source start (docs/mirror.md):
    nothing lies below its start, so consumers and OFFSETS LATEST see the high watermark
    there, not below the log, before any follower fetched."""
    replica = leased()
    leading(replica)
    assert replica.start_at(4200) == 4200
    assert replica.high_watermark(4200) == replica.high_watermark_seen == 4200
    assert replica.start_at(100) is None  # never back
    follower = Replica("clicks-0", 2, Lease(100.0, INCARNATION))
    assert follower.start_at(4200) == 4200 and follower.high_watermark_seen == 4200


def test_in_the_same_term_only_the_isr_changes_and_below_min_insync_ack_all_is_failed() -> None:
    replica = leased()
    leading(replica)
    term = replica.leader
    replica.all_acks.append(ack(10, 1))
    assert replica.adopt(role(isr=(1, 2), version=1), False, 0.0) == ("kept", [])
    assert replica.leader is term and term is not None and term.isr == {1, 2}
    assert len(replica.all_acks) == 1
    adoption, replies = replica.adopt(role(isr=(1,), version=2), False, 0.0)
    assert adoption == "kept"
    assert codes(replies) == ["NOT_ENOUGH_REPLICAS"]


def test_a_produce_is_admitted_by_its_leader_under_the_lease_and_at_ack_all_by_min_insync() -> None:
    alone = Replica("clicks-0", ME, Lease())
    for level in protocol.Ack:
        alone.admit(level, now=1e9)  # one replica: every level, no role, no lease
    replica = leased(until=100.0)
    leading(replica)
    for level in protocol.Ack:
        replica.admit(level, now=50.0)  # ISR 3 of min 2
    assert replica.adopt(role(isr=(1,), version=1), False, 50.0) == ("kept", [])
    with pytest.raises(NotEnoughReplicas):
        replica.admit(protocol.Ack.ALL, now=50.0)
    replica.admit(protocol.Ack.FLUSHED, now=50.0)  # only ack=all needs the ISR
    with pytest.raises(NotLeaderForPartition) as lapsed:
        replica.admit(protocol.Ack.FLUSHED, now=100.0)  # the lease ran out: maybe replaced
    assert lapsed.value.leader == -1


def test_a_produce_answer_goes_now_never_or_to_the_queue_its_level_waits_on() -> None:
    alone = Replica("clicks-0", ME, Lease())
    assert alone.waiting_for(protocol.Ack.NONE, 30, flushed=0) == "never"
    assert alone.waiting_for(protocol.Ack.WRITTEN, 30, flushed=0) == "now"
    assert alone.waiting_for(protocol.Ack.FLUSHED, 30, flushed=0) is alone.acks
    assert alone.waiting_for(protocol.Ack.FLUSHED, 30, flushed=30) == "now"
    assert alone.waiting_for(protocol.Ack.ALL, 30, flushed=0) is alone.acks  # = flushed
    assert alone.waiting_for(protocol.Ack.ALL, 30, flushed=30) == "now"
    replica = leased()
    replica.high_watermark_seen = 10
    leading(replica, flushed=10)  # its term's high watermark at 10
    assert replica.waiting_for(protocol.Ack.ALL, 30, flushed=30) is replica.all_acks
    assert replica.waiting_for(protocol.Ack.ALL, 10, flushed=30) == "now"  # under the HW
    assert replica.waiting_for(protocol.Ack.FLUSHED, 30, flushed=30) == "now"


def test_a_new_epoch_or_another_leader_ends_the_term_and_fails_what_waits() -> None:
    replica = leased()
    leading(replica)
    replica.acks.append(ack(10, 1))
    replica.all_acks.append(ack(10, 2))
    adoption, replies = replica.adopt(role(leader=2, epoch=4), False, 0.0)
    assert adoption == "follow"
    assert replica.leader is None
    assert codes(replies) == ["NOT_LEADER_FOR_PARTITION"] * 2
    # following that leader in that epoch already: nothing to do
    assert replica.adopt(role(leader=2, epoch=4), True, 0.0) == ("kept", [])
    # no leader chosen (-1): neither lead nor follow
    assert replica.adopt(role(leader=-1, epoch=5), False, 0.0) == ("none", [])


def test_a_leader_that_may_have_been_replaced_asks_for_no_isr_change() -> None:
    replica = leased(until=100.0)
    leading(replica)
    assert replica.isr_to_ask(now=5.0) is None  # every follower within LAG_S
    assert replica.isr_to_ask(now=150.0) is None  # lagging followers, but the lease ran out
    shrink = leased(until=1000.0)
    leading(shrink)
    assert shrink.isr_to_ask(now=50.0) == (1,)  # nobody fetched for LAG_S: they leave
