"""A member's rules in the coordinated protocol (broker.client.membership.Membership), free of
I/O: what each heartbeat carries, the lease counted from when a heartbeat was sent, and a
member the coordinator no longer knows dropping everything before it joins again."""

from __future__ import annotations

from broker.client.membership import Membership
from broker.errors import CoordinatorLoading, FencedMemberEpoch, UnknownMemberId
from broker.groups.assignors import TopicPartition
from broker.protocol import GroupHeartbeatReply, partition_list

EVENTS_0, EVENTS_1 = TopicPartition("events", 0), TopicPartition("events", 1)


def membership() -> Membership:
    return Membership("loaders", "m-1", ("events",), 10_000, 300_000)


def reply(epoch: int, *owned: TopicPartition, interval_ms: int = 1000) -> GroupHeartbeatReply:
    return GroupHeartbeatReply(epoch, interval_ms, partition_list(owned))


def test_a_join_then_heartbeats_carry_the_epoch_and_what_is_owned() -> None:
    member = membership()
    join = member.request()
    assert join is not None and (join.member_epoch, join.owned) == (0, ())
    assert join.topics == ("events",) and join.session_timeout_ms == 10_000
    assert member.answered(reply(1, EVENTS_0, EVENTS_1), sent_at=100.0)
    assert member.assignment == {EVENTS_0, EVENTS_1} and member.interval_s == 1.0
    member.owned = frozenset({EVENTS_0, EVENTS_1})
    beat = member.request()
    assert beat is not None and beat.member_epoch == 1
    assert beat.owned == partition_list([("events", 0), ("events", 1)])
    assert not member.answered(reply(1, EVENTS_0, EVENTS_1), sent_at=101.0)  # nothing to do
    assert member.answered(reply(1, EVENTS_0), sent_at=102.0)  # one to give up
    leave = member.request(leave=True)
    assert leave is not None and leave.member_epoch == -1


def test_the_lease_runs_from_when_the_answered_heartbeat_was_sent() -> None:
    member = membership()
    assert not member.may_hand_out(0.0)  # not joined yet
    member.answered(reply(1, EVENTS_0), sent_at=100.0)
    assert member.may_hand_out(109.99)
    assert not member.may_hand_out(110.0)  # the session since the send: the coordinator, later
    assert member.answered(reply(1, EVENTS_0), sent_at=111.0)  # renewed after it ran out
    assert member.may_hand_out(120.9)


def test_an_unknown_or_fenced_member_drops_everything_before_it_joins_again() -> None:
    for refusal in (UnknownMemberId("removed"), FencedMemberEpoch("fenced")):
        member = membership()
        member.answered(reply(3, EVENTS_0), sent_at=100.0)
        member.owned = frozenset({EVENTS_0})
        assert member.refused(refusal)
        assert member.lost and member.epoch == 0 and member.assignment == frozenset()
        assert not member.may_hand_out(100.5)
        assert member.request() is None  # no join while it still owns a partition
        member.owned, member.lost = frozenset(), False
        rejoin = member.request()
        assert rejoin is not None and (rejoin.member_epoch, rejoin.owned) == (0, ())


def test_a_coordinator_moving_changes_nothing() -> None:
    member = membership()
    member.answered(reply(2, EVENTS_0), sent_at=100.0)
    assert not member.refused(CoordinatorLoading("loading"))
    assert member.epoch == 2 and member.assignment == {EVENTS_0} and member.may_hand_out(105.0)


def test_a_member_past_its_processing_deadline_leaves_and_rejoins_only_once_polled() -> None:
    member = Membership("loaders", "m-1", ("events",), 10_000, 60_000, polled_at=100.0)
    member.answered(reply(4, EVENTS_0), sent_at=100.0)
    member.owned = frozenset({EVENTS_0})
    assert not member.past_deadline(160.0)  # a handler of 60 s keeps its partitions
    assert member.past_deadline(160.1)
    leave = member.deadline_passed()
    assert (leave.member_epoch, leave.member_id) == (-1, "m-1")
    assert member.lost and not member.may_hand_out(160.2)
    assert member.request() is None  # no join until the application polls and drops them
    member.owned, member.lost, member.polled_at = frozenset(), False, 170.0
    rejoin = member.request()
    assert rejoin is not None and rejoin.member_epoch == 0


def test_a_member_owning_nothing_has_no_deadline_and_a_static_one_leaves_for_a_moment() -> None:
    idle = Membership("loaders", "m-1", ("events",), 10_000, 1_000)
    idle.answered(reply(1), sent_at=0.0)
    assert not idle.past_deadline(1e9)
    static = Membership("loaders", "m-1", ("events",), 10_000, 300_000, instance_id="loader-a")
    static.answered(reply(2, EVENTS_0), sent_at=0.0)
    leave = static.request(leave=True)
    assert leave is not None and (leave.member_epoch, leave.instance_id) == (-2, "loader-a")
