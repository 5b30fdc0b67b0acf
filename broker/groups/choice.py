"""Which broker coordinates a group: rendezvous hashing onto the brokers up.

Every broker computes the same choice from its own view of /brokers/ids: the broker `b` with the
largest `xxh3_64(utf8(group) + b"\\x00" + decimal(b))`, the lower id on a tie. A broker coming
or going moves only the groups it wins or held (`mod n` would move almost all of them); the
claim node in ZooKeeper fences two brokers whose views differ for a moment
(docs/design/group-coordinator.md, section 1)."""

from __future__ import annotations

from collections.abc import Iterable

from xxhash import xxh3_64_intdigest


def weight(group: str, broker_id: int) -> int:
    """The rendezvous weight of `broker_id` for `group`."""
    return xxh3_64_intdigest(group.encode() + b"\x00" + str(broker_id).encode())


def coordinator_of(group: str, brokers: Iterable[int]) -> int | None:
    """The broker of `brokers` that coordinates `group`; None when there is none."""
    return max(brokers, key=lambda b: (weight(group, b), -b), default=None)
