"""The leader-epoch history (broker.log.epochs) on real files: its format, its changes, the
answers of end_offset_for, and what a missing, damaged or unwritable file does."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.errors import DiskFull, StorageIOError
from broker.log.epochs import (
    CHECKPOINT_NAME,
    EpochEntry,
    LeaderEpochs,
    assign_together,
    format_entries,
    parse,
)


def stored(directory: Path) -> str:
    return (directory / CHECKPOINT_NAME).read_text()


def test_the_documented_example_is_the_file_written(tmp_path: Path) -> None:
    epochs = LeaderEpochs.load(tmp_path)
    assert epochs.entries == () and epochs.latest_epoch == -1 and epochs.problems == ()
    assert not (tmp_path / CHECKPOINT_NAME).exists()  # nothing written until a change
    for epoch, start in ((0, 0), (2, 1048576), (5, 7340032)):
        assert epochs.assign(epoch, start)
    assert stored(tmp_path) == "1\n3\n0 0\n2 1048576\n5 7340032\n"
    again = LeaderEpochs.load(tmp_path)
    assert again.entries == ((0, 0), (2, 1048576), (5, 7340032))
    assert again.latest_epoch == 5
    assert not (tmp_path / f"{CHECKPOINT_NAME}.tmp").exists()


def test_documented_format_in_storage_md_parses() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "storage.md").read_text()
    block = doc.split("<!-- leader-epoch-checkpoint example -->\n```\n", 1)[1].split("```", 1)[0]
    text = "".join(line.split("#", 1)[0].rstrip() + "\n" for line in block.splitlines())
    assert parse(text.encode()) == [(0, 0), (2, 1048576), (5, 7340032)]
    assert "it is `1\\n3\\n0 0\\n2 1048576\\n5 7340032\\n`" in doc
    # the answers the section gives for these entries and a log end of 9437184
    epochs = LeaderEpochs(Path("."), parse(text.encode()))
    answers = {e: epochs.end_offset_for(e, 9437184, 17) for e in (-1, 0, 1, 2, 3, 4, 5, 9)}
    assert answers == {
        -1: (-1, 17),
        0: (0, 1048576),
        1: (0, 1048576),
        2: (2, 7340032),
        3: (2, 7340032),
        4: (2, 7340032),
        5: (5, 9437184),
        9: (5, 9437184),
    }


def test_assign_same_epoch_is_nothing_and_lower_is_refused(tmp_path: Path) -> None:
    epochs = LeaderEpochs.load(tmp_path)
    epochs.assign(3, 100)
    before = stored(tmp_path)
    assert not epochs.assign(3, 500)  # the latest already: nothing, nothing written
    assert stored(tmp_path) == before
    with pytest.raises(ValueError, match="below the latest"):
        epochs.assign(2, 500)
    with pytest.raises(ValueError, match="before epoch 3"):
        epochs.assign(4, 99)
    with pytest.raises(ValueError, match="outside"):
        epochs.assign(-1, 500)
    with pytest.raises(ValueError, match="outside"):
        epochs.assign(5, -1)
    assert epochs.entries == ((3, 100),) and stored(tmp_path) == before


def test_a_new_epoch_at_the_last_start_replaces_it(tmp_path: Path) -> None:
    epochs = LeaderEpochs.load(tmp_path)
    epochs.assign_all([(1, 0), (2, 100), (3, 100)])  # epoch 2 wrote nothing
    assert epochs.entries == ((1, 0), (3, 100))
    assert LeaderEpochs.load(tmp_path).entries == ((1, 0), (3, 100))


def test_assign_all_refuses_before_changing_anything(tmp_path: Path) -> None:
    epochs = LeaderEpochs.load(tmp_path)
    epochs.assign(1, 0)
    with pytest.raises(ValueError):
        epochs.assign_all([(2, 10), (1, 20)])
    assert epochs.entries == ((1, 0),) and LeaderEpochs.load(tmp_path).entries == ((1, 0),)


def test_end_offset_for(tmp_path: Path) -> None:
    epochs = LeaderEpochs(tmp_path, [EpochEntry(2, 100), EpochEntry(4, 300), EpochEntry(7, 900)])
    leo, start = 1200, 50
    assert epochs.end_offset_for(7, leo, start) == (7, 1200)  # the latest: the log end
    assert epochs.end_offset_for(9, leo, start) == (7, 1200)  # above it: the latest's
    assert epochs.end_offset_for(4, leo, start) == (4, 900)
    assert epochs.end_offset_for(5, leo, start) == (4, 900)  # 5 unknown: 4 is the largest <= 5
    assert epochs.end_offset_for(2, leo, start) == (2, 300)
    assert epochs.end_offset_for(3, leo, start) == (2, 300)
    assert epochs.end_offset_for(1, leo, start) == (-1, 50)  # none at or below: the log start
    assert epochs.end_offset_for(-1, leo, start) == (-1, 50)
    assert LeaderEpochs(tmp_path).end_offset_for(3, leo, start) == (-1, 50)
    assert epochs.epoch_at(99) == -1 and epochs.epoch_at(100) == 2 and epochs.epoch_at(899) == 4


def test_truncate_from_and_clear_and_start(tmp_path: Path) -> None:
    epochs = LeaderEpochs.load(tmp_path)
    epochs.assign_all([(1, 0), (3, 100), (4, 250)])
    assert not epochs.truncate_from(251)
    assert epochs.truncate_from(250)  # an entry starting at the cut goes
    assert epochs.entries == ((1, 0), (3, 100))
    assert epochs.truncate_from(50)
    assert LeaderEpochs.load(tmp_path).entries == ((1, 0),)
    epochs.clear_and_start(7000)
    assert len(epochs) == 0 and stored(tmp_path) == "1\n0\n"
    epochs.clear_and_start(7000, 8)
    assert LeaderEpochs.load(tmp_path).entries == ((8, 7000),)


def test_entries_past_the_log_end_are_dropped_on_load(tmp_path: Path) -> None:
    LeaderEpochs.load(tmp_path).assign_all([(1, 0), (2, 500), (3, 800)])
    epochs = LeaderEpochs.load(tmp_path, log_end_offset=500)
    assert epochs.entries == ((1, 0), (2, 500))  # the entry at the log end stays
    assert epochs.problems == (
        f"{CHECKPOINT_NAME}: entries starting after the log end 500 dropped: (3, 800)",
    )
    assert "3 800" in stored(tmp_path)  # in memory only, until the next change
    epochs.assign(4, 500)
    assert stored(tmp_path) == "1\n2\n1 0\n4 500\n"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"1\n2\n0 0\n", "says 2 entries but holds 1"),
        (b"1\n1\n0 0", "does not end with a newline"),
        (b"2\n0\n", "format version is '2'"),
        (b"1\n2\n3 0\n2 10\n", "line 4 does not follow"),
        (b"1\n2\n3 10\n4 10\n", "line 4 does not follow"),
        (b"1\n1\n0 -5\n", "line 3 is not an epoch and a start offset"),
        (b"1\n1\n0  5\n", "line 3 is not an epoch and a start offset"),
        (b"1\n1\n2147483648 5\n", "out of range"),
        (b"\xff\xfe", "not ASCII"),
        (b"", "does not end with a newline"),
        (b"1\n", "not a count"),
    ],
)
def test_a_damaged_file_is_set_aside_and_the_history_starts_empty(
    tmp_path: Path, content: bytes, reason: str
) -> None:
    (tmp_path / CHECKPOINT_NAME).write_bytes(content)
    (tmp_path / f"{CHECKPOINT_NAME}.bad").write_bytes(b"an older one")
    epochs = LeaderEpochs.load(tmp_path)
    assert epochs.entries == ()
    (problem,) = epochs.problems
    assert reason in problem
    assert problem.endswith(
        f"; set aside as {CHECKPOINT_NAME}.1.bad, starting with no leader epochs"
    )
    assert (tmp_path / f"{CHECKPOINT_NAME}.1.bad").read_bytes() == content
    assert (tmp_path / f"{CHECKPOINT_NAME}.bad").read_bytes() == b"an older one"
    assert not (tmp_path / CHECKPOINT_NAME).exists()
    epochs.assign(0, 0)
    assert LeaderEpochs.load(tmp_path).entries == ((0, 0),)


def test_an_unreadable_file_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_NAME).mkdir()  # read_bytes: IsADirectoryError
    epochs = LeaderEpochs.load(tmp_path)
    assert epochs.entries == ()
    assert "it cannot be read" in epochs.problems[0]
    assert (tmp_path / f"{CHECKPOINT_NAME}.bad").is_dir()


def test_a_leftover_tmp_file_is_deleted(tmp_path: Path) -> None:
    LeaderEpochs.load(tmp_path).assign(1, 0)
    (tmp_path / f"{CHECKPOINT_NAME}.tmp").write_bytes(b"1\n")  # a crash mid-write
    epochs = LeaderEpochs.load(tmp_path)
    assert epochs.entries == ((1, 0),) and epochs.problems == ()
    assert not (tmp_path / f"{CHECKPOINT_NAME}.tmp").exists()


@pytest.mark.parametrize(("error", "kind"), [(errno.EIO, StorageIOError), (errno.ENOSPC, DiskFull)])
def test_a_failed_write_raises_and_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: int, kind: type[Exception]
) -> None:
    epochs = LeaderEpochs.load(tmp_path)
    epochs.assign(1, 0)
    before = stored(tmp_path)

    def failing_fsync(fd: int) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(kind, match=CHECKPOINT_NAME):
        epochs.assign(2, 10)
    with pytest.raises(kind, match=CHECKPOINT_NAME):
        epochs.truncate_from(0)
    with pytest.raises(kind, match=CHECKPOINT_NAME):
        epochs.clear_and_start(5)
    assert epochs.entries == ((1, 0),)
    assert stored(tmp_path) == before
    assert not (tmp_path / f"{CHECKPOINT_NAME}.tmp").exists()
    monkeypatch.undo()
    assert epochs.assign(2, 10)


def histories(root: Path, count: int) -> list[LeaderEpochs]:
    """`count` partition folders under `root`, each a history of one entry (0, 0)."""
    found = []
    for number in range(count):
        folder = root / f"clicks-{number}"
        folder.mkdir()
        history = LeaderEpochs.load(folder)
        history.assign(0, 0)
        found.append(history)
    return found


def test_histories_assigned_together_are_written_as_one_by_one_and_each_gets_its_error(
    tmp_path: Path,
) -> None:
    a, b, c, d = histories(tmp_path, 4)
    results = assign_together(
        [
            (a, [(2, 100)]),
            (b, [(0, 50)]),  # its epoch already: nothing written
            (c, [(3, 10), (5, 90)]),
            (d, [(-1, 0)]),  # out of range: refused, its history as it was
            (a, [(4, 300)]),  # named twice: after the rest
        ]
    )
    assert [type(r).__name__ if r else None for r in results] == [
        None,
        None,
        None,
        "ValueError",
        None,
    ]
    assert a.entries == ((0, 0), (2, 100), (4, 300))
    assert c.entries == ((0, 0), (3, 10), (5, 90))
    assert b.entries == d.entries == ((0, 0),)
    for history in (a, b, c, d):
        assert LeaderEpochs.load(history.directory).entries == history.entries
        assert not (history.directory / f"{CHECKPOINT_NAME}.tmp").exists()


def test_a_syncfs_that_fails_has_each_history_written_on_its_own_with_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # syncfs cannot say whose file its error concerns: each history is then written and
    # fsynced on its own, and only the one whose own fsync fails gets an error.
    a, b, c = histories(tmp_path, 3)
    fsync = os.fsync

    def failing_syncfs(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    def fsync_failing_for_b(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(b.directory)):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        fsync(fd)

    monkeypatch.setattr("broker.log.epochs.syncfs", failing_syncfs)
    monkeypatch.setattr(os, "fsync", fsync_failing_for_b)
    results = assign_together([(a, [(1, 10)]), (b, [(1, 20)]), (c, [(1, 30)])])
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], StorageIOError) and CHECKPOINT_NAME in str(results[1])
    monkeypatch.undo()
    assert a.entries == ((0, 0), (1, 10)) and c.entries == ((0, 0), (1, 30))
    assert b.entries == ((0, 0),)
    for history in (a, b, c):
        assert LeaderEpochs.load(history.directory).entries == history.entries


def test_a_history_whose_file_cannot_be_written_fails_alone(tmp_path: Path) -> None:
    a, b, c = histories(tmp_path, 3)
    (b.directory / CHECKPOINT_NAME).unlink()
    b.directory.rmdir()  # its folder gone (a partition deleted meanwhile)
    results = assign_together([(a, [(1, 10)]), (b, [(1, 20)]), (c, [(1, 30)])])
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], StorageIOError)
    assert b.entries == ((0, 0),)
    assert LeaderEpochs.load(a.directory).entries == ((0, 0), (1, 10))
    assert LeaderEpochs.load(c.directory).entries == ((0, 0), (1, 30))


entry_lists = st.lists(
    st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)), max_size=20
).map(lambda pairs: sorted({p[0]: p for p in pairs}.values()))


@settings(max_examples=100, deadline=None)
@given(entry_lists, st.integers(-1, 2**31), st.integers(0, 2**63 - 1))
def test_a_history_survives_its_file_and_answers_by_its_definition(
    pairs: list[tuple[int, int]], epoch: int, offset: int
) -> None:
    starts = sorted({start for _, start in pairs})
    entries = [EpochEntry(e, s) for (e, _), s in zip(pairs, starts, strict=False)]
    assert parse(format_entries(entries)) == entries
    with tempfile.TemporaryDirectory() as tmp:
        epochs = LeaderEpochs.load(Path(tmp))
        epochs.assign_all(entries)
        assert LeaderEpochs.load(Path(tmp)).entries == tuple(entries)
        leo = max([offset, *starts])
        answer = epochs.end_offset_for(epoch, leo, 0)
        below = [e for e in entries if e.epoch <= epoch]
        if not below:
            assert answer == (-1, 0)
        else:
            above = [e.start_offset for e in entries if e.epoch > below[-1].epoch]
            assert answer == (below[-1].epoch, above[0] if above else leo)
        epochs.truncate_from(offset)
        assert epochs.entries == tuple(e for e in entries if e.start_offset < offset)
        assert LeaderEpochs.load(Path(tmp)).entries == epochs.entries
