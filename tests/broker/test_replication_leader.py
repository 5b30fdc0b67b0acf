"""The leader's bookkeeping (broker/replication/leader.py): the high watermark, the ISR changes it
asks for, and the epoch entries a follower's fetch carries."""

from __future__ import annotations

from broker.log.epochs import EpochEntry
from broker.replication.leader import ISR_RETRY_S, LeaderState, epoch_entries


def leader(isr: tuple[int, ...] = (1, 2, 3), high_watermark: int = 0) -> LeaderState:
    """Broker 1 leads epoch 4 from offset 100, replicas 1, 2, 3; a follower lags after 10 s."""
    return LeaderState(1, 4, 100, (1, 2, 3), isr, high_watermark, 10.0, now=0.0)


def test_the_high_watermark_is_the_lowest_flushed_offset_in_the_isr_and_never_moves_back() -> None:
    state = leader()
    assert not state.raise_high_watermark(
        leader_flushed=500
    )  # the followers have shown nothing yet
    state.record_fetch(2, offset=400, flushed=300, leader_flushed=500, now=1.0)
    state.record_fetch(3, offset=500, flushed=450, leader_flushed=500, now=1.0)
    assert state.raise_high_watermark(500) and state.high_watermark == 300
    state.record_fetch(2, offset=500, flushed=500, leader_flushed=500, now=2.0)
    assert state.raise_high_watermark(500) and state.high_watermark == 450
    state.set_isr((1, 2), version=1)  # 3 left: only 1 and 2 count
    assert state.raise_high_watermark(500) and state.high_watermark == 500
    state.set_isr((1, 2, 3), version=2)  # 3 back, behind: the high watermark stays
    assert not state.raise_high_watermark(500) and state.high_watermark == 500


def test_a_follower_flushed_offset_counts_only_up_to_where_it_fetches() -> None:
    state = leader(isr=(1, 2))
    state.record_fetch(2, offset=200, flushed=900, leader_flushed=500, now=1.0)
    state.raise_high_watermark(500)
    assert state.high_watermark == 200


def test_a_lagging_follower_is_asked_out_and_a_caught_up_one_asked_in_once() -> None:
    state = leader()
    state.record_fetch(2, offset=500, flushed=500, leader_flushed=500, now=9.0)
    state.record_fetch(3, offset=300, flushed=300, leader_flushed=500, now=9.0)  # behind
    assert state.wanted_isr(now=10.5) == (1, 2)  # 3 last caught up at 0: 10.5 s ago
    assert state.wanted_isr(now=11.0) is None  # asked: not again while awaited
    assert state.wanted_isr(now=10.5 + ISR_RETRY_S + 0.1) == (1, 2)  # asked again
    state.set_isr((1, 2), version=1)
    state.raise_high_watermark(500)
    state.record_fetch(2, offset=500, flushed=500, leader_flushed=500, now=20.0)
    state.record_fetch(3, offset=500, flushed=500, leader_flushed=500, now=20.0)
    assert state.wanted_isr(now=20.5, fetched=3) == (1, 2, 3)  # caught up, flushed the HW


def test_a_follower_below_the_leaders_epoch_start_is_not_asked_in() -> None:
    state = leader(isr=(1, 2), high_watermark=50)
    state.record_fetch(3, offset=80, flushed=80, leader_flushed=80, now=1.0)  # before 100
    assert state.wanted_isr(now=1.0, fetched=3) is None
    state.record_fetch(3, offset=100, flushed=100, leader_flushed=100, now=2.0)
    assert state.wanted_isr(now=2.0, fetched=3) == (1, 2, 3)


def test_a_fetch_carries_the_entry_in_effect_and_those_starting_in_its_bytes() -> None:
    entries = [EpochEntry(0, 0), EpochEntry(2, 100), EpochEntry(5, 300)]
    assert epoch_entries(entries, 150, 250) == (EpochEntry(2, 100),)
    assert epoch_entries(entries, 50, 300) == tuple(entries)  # the end included
    assert epoch_entries(entries, 300, 300) == (EpochEntry(5, 300),)
    assert epoch_entries([], 0, 10) == ()


def test_a_follower_asked_into_the_isr_counts_until_a_newer_state_tells_the_outcome() -> None:
    """ZooKeeper may list it as soon as the supervisor writes it: the high watermark must wait
    for it from the moment it is asked (the controller may choose it), not from the answer."""
    state = leader(isr=(1, 2), high_watermark=100)
    state.record_fetch(2, offset=300, flushed=300, leader_flushed=300, now=1.0)
    state.record_fetch(3, offset=100, flushed=100, leader_flushed=300, now=1.0)
    state.record_fetch(3, offset=100, flushed=100, leader_flushed=100, now=1.0)  # caught up
    assert state.wanted_isr(now=1.0, fetched=3) == (1, 2, 3)
    assert not state.raise_high_watermark(300)  # 3 has flushed only 100: the watermark waits for it
    state.set_isr((1, 2), version=0)  # an older state node (the one it was asked from)
    assert not state.raise_high_watermark(300)
    state.set_isr((1, 2), version=1)  # the write lost to another: 3 is not in ZooKeeper
    assert state.raise_high_watermark(300) and state.high_watermark == 300


def test_a_follower_behind_a_leader_that_flushes_all_the_time_is_still_caught_up() -> None:
    state = leader()
    for i in range(1, 30):  # each fetch reaches the leader's flushed end of the fetch before
        state.record_fetch(2, offset=100 * i, flushed=100 * i, leader_flushed=100 * i + 50, now=i)
    assert state.followers[2].caught_up_at == 28
    assert state.wanted_isr(now=29.0) == (1, 2)  # 3 never fetched: out; 2 stays


def test_a_follower_that_stopped_fetching_is_not_taken_back_into_the_isr() -> None:
    """Its broker died: the controller took it out of the ISR at its session's end, within
    the lag window of its last fetch. The leader's own checks must not take it back in (ack=all
    would wait for it until the lag rule took it out again); its next fetch may."""
    state = leader(isr=(1, 2, 3), high_watermark=100)
    state.record_fetch(2, offset=100, flushed=100, leader_flushed=100, now=1.0)
    state.record_fetch(3, offset=100, flushed=100, leader_flushed=100, now=1.0)
    state.set_isr((1, 2), version=1)  # the controller: broker 3 is dead
    assert state.wanted_isr(now=2.0) is None
    assert state.wanted_isr(now=2.0, fetched=2) is None
    state.record_fetch(3, offset=100, flushed=100, leader_flushed=100, now=3.0)  # back
    assert state.wanted_isr(now=3.0, fetched=3) == (1, 2, 3)
