"""Placement of a topic's partitions over this broker's log dirs and workers: a pure function,
so these cases need no process, socket or file."""

from __future__ import annotations

from broker.placement import partition_folder, place_partitions


def test_one_log_dir_and_one_worker_take_every_partition() -> None:
    assert place_partitions("clicks", range(4), [7], {}, 1) == {0: 0, 1: 0, 2: 0, 3: 0}


def test_new_partitions_go_to_the_log_dir_holding_fewest_counting_those_placed_before() -> None:
    # Dirs tie at 0: the first wins, then they take turns.
    assert place_partitions("clicks", range(4), [0, 0], {}, 1) == {0: 0, 1: 1, 2: 0, 3: 1}
    # Dir 0 holds 3 already: dir 1 takes new partitions until it holds as many.
    assert place_partitions("clicks", range(5), [3, 0], {}, 1) == {0: 1, 1: 1, 2: 1, 3: 0, 4: 1}


def test_a_partition_whose_folder_exists_stays_in_its_log_dir_and_counts_there() -> None:
    # Partition 0's folder is in the fuller dir 1: it stays there, and counts there, so that
    # partition 1 goes to dir 0, which then ties with dir 1 (6 each): partition 2 goes to the
    # first of them.
    assert place_partitions("clicks", [0, 1, 2], [5, 5], {0: 1}, 1) == {0: 1, 1: 0, 2: 0}
    assert place_partitions("clicks", [0, 1, 2], [0, 9], {0: 1}, 1) == {0: 1, 1: 0, 2: 0}


def test_workers_of_a_log_dir_share_its_partitions_by_xxh32_of_the_folder_name() -> None:
    # 3 workers per dir: dir 0 has workers 0-2, dir 1 workers 3-5. XXH32("clicks-n") % 3 is
    # 2, 2, 2, 2, 0, 1 for n = 0..5, whichever dir the partition lands in.
    placed = place_partitions("clicks", range(6), [0, 0], {}, 3)
    assert placed == {0: 2, 1: 5, 2: 2, 3: 5, 4: 0, 5: 4}
    assert partition_folder("clicks", 4) == "clicks-4"


def test_placement_depends_only_on_its_arguments_and_leaves_them_unchanged() -> None:
    held = [2, 1, 4]
    found = {3: 2}
    first = place_partitions("events", [1, 3, 5, 7], held, found, 2)
    assert held == [2, 1, 4] and found == {3: 2}
    assert place_partitions("events", [1, 3, 5, 7], held, found, 2) == first
    assert {w // 2 for w in first.values()} <= {0, 1, 2}
    assert first[3] // 2 == 2  # found in dir 2
