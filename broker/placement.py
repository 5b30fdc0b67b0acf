"""Placement: which brokers hold each partition of a topic (its replicas), and which worker of
this broker holds each of its partitions.

Replicas (assign_replicas, docs/replication.md "Placement"): the brokers are put in an order,
by id without racks, alternating racks with them, so that neighbours in the list are on
different racks; partition p's first replica (its preferred leader) is the (p mod n)-th broker
of that list, so leadership is dealt round robin; each next replica is the first broker after
the first replica in that list (wrapping) whose rack no replica of p has yet, and once every
rack has one, the first not chosen yet.

Workers: workers are numbered log dir by log dir: with `workers_per_dir` of them a dir, the
workers of log dir d are d·workers_per_dir to (d + 1)·workers_per_dir - 1. A partition whose
folder already exists in a log dir stays there (its data is there); a new one goes to the log
dir that holds the fewest partitions, counting those placed before it (the first of those
tied); within its dir, the workers share the partitions by XXH32 of the folder name
`<topic>-<partition>`.

Pure functions: what is held and what is on disk come in as arguments, so the same inputs
always give the same placement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import xxhash


def partition_folder(topic: str, number: int) -> str:
    """The name of a partition's folder in its log dir."""
    return f"{topic}-{number}"


def place_partitions(
    topic: str,
    numbers: Iterable[int],
    held_per_dir: Sequence[int],
    found: Mapping[int, int],
    workers_per_dir: int,
) -> dict[int, int]:
    """The worker index of each partition `numbers` of `topic`. `held_per_dir[d]` is how many
    partitions log dir d holds now (one entry per log dir); `found` maps a partition whose
    folder exists to the log dir it is in."""
    counts = list(held_per_dir)
    workers = {}
    for number in numbers:
        d = found.get(number)
        if d is None:
            d = min(range(len(counts)), key=counts.__getitem__)
        counts[d] += 1
        name = partition_folder(topic, number)
        workers[number] = (
            d * workers_per_dir + xxhash.xxh32_intdigest(name.encode()) % workers_per_dir
        )
    return workers


def broker_order(racks: Mapping[int, str | None]) -> list[int]:
    """The brokers of `racks` (broker id -> its rack, None without one) in placement order:
    by id when no broker has a rack; else rack by rack in turn (rack names sorted, the brokers
    without a rack last, as one more rack): the first broker by id of each, then the second of
    each, and so on, a rack left out once it has no more."""
    if all(rack is None for rack in racks.values()):
        return sorted(racks)
    groups: dict[str | None, list[int]] = {}
    for broker_id in sorted(racks):
        groups.setdefault(racks[broker_id], []).append(broker_id)
    names = sorted(name for name in groups if name is not None)
    ordered = [groups[name] for name in names] + ([groups[None]] if None in groups else [])
    return [group[i] for i in range(max(map(len, ordered))) for group in ordered if i < len(group)]


def assign_replicas(
    partitions: int, racks: Mapping[int, str | None], replication_factor: int
) -> tuple[tuple[int, ...], ...]:
    """The replicas of each of `partitions` partitions over the brokers of `racks` (broker id
    -> its rack, None for a broker without one), `replication_factor` distinct brokers each, the
    first the partition's preferred leader.

    With L = broker_order(racks) of n brokers: partition p's first replica is L[p mod n]; each
    next one is the first broker in L after the first replica (wrapping) whose rack no replica
    of p has yet, and once every rack has a replica of p (at once when no broker has a rack),
    the first not chosen yet. Brokers without a rack count as one rack together. So leadership
    goes round robin over L, and each partition spans min(replication_factor, racks) racks.

    ValueError when `partitions` is not an integer >= 0, `racks` is empty or names a broker id
    that is not an integer >= 0 or a rack that is not a non-empty string or None, or
    `replication_factor` is below 1 or above the number of brokers."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 0:
        raise ValueError(f"partitions must be an integer >= 0, not {partitions!r}")
    if not racks:
        raise ValueError("no broker to place replicas on")
    for broker_id, rack in racks.items():
        if isinstance(broker_id, bool) or not isinstance(broker_id, int) or broker_id < 0:
            raise ValueError(f"a broker id is an integer >= 0, not {broker_id!r}")
        if rack is not None and (not isinstance(rack, str) or not rack):
            raise ValueError(f"broker {broker_id}'s rack must be a non-empty string or None")
    n = len(racks)
    if (
        isinstance(replication_factor, bool)
        or not isinstance(replication_factor, int)
        or not 1 <= replication_factor <= n
    ):
        raise ValueError(
            f"replication factor {replication_factor!r} is not between 1 and the {n} "
            f"broker(s) to place replicas on"
        )
    order = broker_order(racks)
    rack_count = len(set(racks.values()))
    assignment = []
    for p in range(partitions):
        first = p % n
        chosen = [order[first]]
        taken = {racks[order[first]]}
        while len(chosen) < replication_factor:
            every_rack_taken = len(taken) == rack_count
            for i in range(first + 1, first + n):
                broker_id = order[i % n]
                if broker_id not in chosen and (every_rack_taken or racks[broker_id] not in taken):
                    chosen.append(broker_id)
                    taken.add(racks[broker_id])
                    break
        assignment.append(tuple(chosen))
    return tuple(assignment)
