"""Placement: which worker of this broker holds each of its partitions of a topic.

Workers are numbered log dir by log dir: with `workers_per_dir` of them a dir, the workers of
log dir d are d·workers_per_dir to (d + 1)·workers_per_dir - 1. A partition whose folder
already exists in a log dir stays there (its data is there); a new one goes to the log dir that
holds the fewest partitions, counting those placed before it (the first of those tied); within
its dir, the workers share the partitions by XXH32 of the folder name `<topic>-<partition>`.

A pure function: what is held and what is on disk come in as arguments, so the same inputs
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
