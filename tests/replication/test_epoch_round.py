"""A worker's round of leader-epoch writes (broker.replication.follower.EpochRound): the
copy loops that ask in one turn have their histories written together, each told its own
error."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.log.epochs import EpochEntry, LeaderEpochs, assign_together
from broker.replication.follower import EpochRound


def history(root: Path, number: int) -> LeaderEpochs:
    folder = root / f"clicks-{number}"
    folder.mkdir()
    return LeaderEpochs.load(folder)


async def test_one_turns_histories_are_written_together_and_each_told_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    epochs = EpochRound()
    histories = [history(tmp_path, n) for n in range(4)]
    histories[3].assign(5, 0)  # an epoch below its latest is refused to that one alone
    written: list[int] = []

    def counted(assignments: list[tuple[LeaderEpochs, list[tuple[int, int]]]]) -> object:
        written.append(len(assignments))
        return assign_together(assignments)

    monkeypatch.setattr("broker.replication.follower.assign_together", counted)
    errors: dict[int, str] = {}

    async def assign(number: int) -> None:
        try:
            await epochs.assign(histories[number], (1, 0))
        except ValueError as error:
            errors[number] = str(error)

    async with trio.open_nursery() as nursery:
        for number in range(4):
            nursery.start_soon(assign, number)
    assert written == [4]  # one write for the four
    assert errors == {3: "leader epoch 1 is below the latest, 5"}
    for number in range(3):
        assert histories[number].entries == (EpochEntry(1, 0),)
        assert LeaderEpochs.load(histories[number].directory).entries == (EpochEntry(1, 0),)
