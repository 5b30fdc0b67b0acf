"""A group's target assignment: which member should own which partition
(docs/design/group-coordinator.md, section 4).

An assignor sees every partition of each subscribed topic, whether or not a replica is up now,
so a partition unavailable for a moment stays with its member. It is a pure function of the
members' subscriptions, the topics' partitions and the previous target:

- `uniform` (the default), sticky, balanced topic by topic: of a topic's `P` partitions and `n`
  subscribers each gets `P div n` and `P mod n` get one more (those with the fewest partitions
  so far over all topics, then those keeping most of this topic, then by member id). Each keeps
  its previous target's partitions up to its share, lowest-numbered first; the rest go, in
  order, to the member with most room. A member joining ten over 900 partitions moves 81.
- `range`: the paper's (docs/registry.md, step 3), per topic: the partitions in the order the
  caller gives (by name broker, then number), subscribers by rank (instance id, else member
  id), each a contiguous share. Not sticky.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A partition as the group protocol names it: its topic and number."""

    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class Subscriber:
    """What an assignor knows of a member: the topics it subscribes to, and its rank for
    `range` (its instance id when it has one, else its member id)."""

    topics: frozenset[str]
    rank: str


Target = dict[str, frozenset[TopicPartition]]
"""Member id -> the partitions it should own. Every partition of a subscribed topic is in
exactly one member's set."""

Assignor = Callable[
    [Mapping[str, Subscriber], Mapping[str, Sequence[int]], Mapping[str, Iterable[TopicPartition]]],
    Target,
]
"""(subscribers, partitions of each topic in range order, previous target) -> target."""


def contiguous_share(count: int, members: int, index: int) -> slice:
    """The range assignment's share of the member ranked `index` of `members`, over `count`
    items in order: contiguous, the first `count % members` members taking one more."""
    share, extra = divmod(count, members)
    start = index * share + min(index, extra)
    return slice(start, start + share + (1 if index < extra else 0))


def _subscribers_of(topic: str, subscribers: Mapping[str, Subscriber]) -> list[str]:
    return sorted(m for m, s in subscribers.items() if topic in s.topics)


def uniform(
    subscribers: Mapping[str, Subscriber],
    partitions: Mapping[str, Sequence[int]],
    previous: Mapping[str, Iterable[TopicPartition]],
) -> Target:
    """The sticky, balanced assignment (module docstring)."""
    kept_before: dict[str, dict[str, list[int]]] = {m: {} for m in subscribers}
    for member, tps in previous.items():
        if member in kept_before:
            for topic, number in tps:
                kept_before[member].setdefault(topic, []).append(number)
    totals = dict.fromkeys(subscribers, 0)
    target: dict[str, set[TopicPartition]] = {m: set() for m in subscribers}
    for topic in sorted(partitions):
        members = _subscribers_of(topic, subscribers)
        if not members:
            continue
        numbers = partitions[topic]
        valid = set(numbers)
        kept = {m: sorted(p for p in kept_before[m].get(topic, ()) if p in valid) for m in members}
        share, extra = divmod(len(numbers), len(members))
        ranked = sorted(members, key=lambda m: (totals[m], -len(kept[m]), m))
        quota = {m: share + (1 if i < extra else 0) for i, m in enumerate(ranked)}
        taken: set[int] = set()
        have = dict.fromkeys(members, 0)
        for member in members:
            for number in kept[member]:
                if have[member] == quota[member]:
                    break
                if number not in taken:
                    taken.add(number)
                    have[member] += 1
                    target[member].add(TopicPartition(topic, number))
        room = [(have[m] - quota[m], m) for m in members if have[m] < quota[m]]
        heapq.heapify(room)
        for number in sorted(valid - taken):
            short, member = heapq.heappop(room)
            target[member].add(TopicPartition(topic, number))
            if short + 1 < 0:
                heapq.heappush(room, (short + 1, member))
        for member in members:
            totals[member] += quota[member]
    return {m: frozenset(tps) for m, tps in target.items()}


def range_assignment(
    subscribers: Mapping[str, Subscriber],
    partitions: Mapping[str, Sequence[int]],
    previous: Mapping[str, Iterable[TopicPartition]],
) -> Target:
    """The paper's range assignment, topic by topic (module docstring); `previous` unused."""
    target: dict[str, list[TopicPartition]] = {m: [] for m in subscribers}
    for topic in sorted(partitions):
        members = sorted(_subscribers_of(topic, subscribers), key=lambda m: subscribers[m].rank)
        numbers = partitions[topic]
        for index, member in enumerate(members):
            share = numbers[contiguous_share(len(numbers), len(members), index)]
            target[member].extend(TopicPartition(topic, n) for n in share)
    return {m: frozenset(tps) for m, tps in target.items()}


ASSIGNORS: dict[str, Assignor] = {"uniform": uniform, "range": range_assignment}
"""The assignors by the names a member gives in its heartbeat."""
