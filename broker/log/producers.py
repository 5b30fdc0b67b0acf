"""The idempotent producers of one partition: which sets each has stored, so that a set sent
again is stored once (docs/storage.md, "Producer state"; docs/protocol.md, PRODUCE version 3).

An idempotent producer numbers its sets to each partition 0, 1, 2, ... (`sequence`, a u32
that wraps) under its `producer_id` and `epoch`. For each producer the partition remembers the
last set it stored: a set of the next sequence is appended, the last one again is answered
with its offset and count (a duplicate), one further back is looked up in the files below
(`DuplicateSequence` when its segment is gone; but one back only through the wrap, 2^32 - 1
after 0, is `OutOfOrderSequence` unless the files show the producer's sequences wrapped: it
was never sent), one further on is `OutOfOrderSequence` (a set before it is missing), and one
of an older epoch is `InvalidProducerEpoch`. A producer id not known here (new, or
forgotten) starts at sequence 0: a first set of another sequence is `UnknownProducerId` (the
client numbers a set it never sent before again under a new id, and fails one it sent before:
that one may be stored already). A newer epoch starts at 0 too: another sequence is
`OutOfOrderSequence`.

Each segment `<base>.log` has a file `<base>.producers` of fixed-size entries, 34 bytes each,
big-endian:

    producer_id u64, producer_epoch u16, sequence u32, offset u64, end u64, message_count u32

one for each idempotent set stored in the segment (`offset` and `end` where its bytes start
and end, `message_count` its messages, as PRODUCE answered), in the order stored; a segment
started by a roll begins with a snapshot, the last entry of every producer known then. So the
last segment's file alone holds the state, and a segment deleted (retention, truncation) takes
its entries with it. An entry is written before its set's bytes, so no set survives a crash of
the broker without its entry (the page cache keeps both); when the topic fsyncs, a flush makes
the entries as durable as the bytes it syncs (`unsynced`: the flush round syncs the file, and
its creation, with them), so that no set survives a power loss without its entry either. An
entry whose set did not survive (its end past the log end) is dropped when the log is opened,
and a torn entry at the file's end is cut. At most MAX_PRODUCERS producers are remembered per
partition: a new one takes the place of the one that stored least recently only if that one
stored nothing for PROTECTED_S, and is refused (`TooManyProducers`) otherwise. A leader notes
which client id let each producer in (`check`'s `client`), so that one client id that makes up
producer ids cannot take every place: the last RESERVED places are kept for client ids that
hold fewer than RESERVED (`_check_share`). Not safe to share between threads.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from broker.clock import SYSTEM_CLOCK, Clock
from broker.errors import (
    DuplicateSequence,
    InvalidProducerEpoch,
    OutOfOrderSequence,
    TooManyProducers,
    UnknownProducerId,
)
from broker.log.files import OPEN_FILES
from broker.log.fsdir import fsync_directory, storage_error
from broker.log.segment import PRODUCERS_SUFFIX, segment_file_name

ENTRY = struct.Struct(">QHIQQI")
"""producer_id, producer_epoch, sequence, offset, end, message_count: StoredSet's fields."""
_KEY = struct.Struct(">QHI")
"""The start of an entry: producer_id, epoch, sequence, what a set is looked up by."""
MAX_PRODUCERS = 4096
"""Producers remembered per partition; past it, the one that stored least recently is
forgotten, if it stored nothing for PROTECTED_S."""
PROTECTED_S = 300.0
"""A producer that stored a set this recently is never forgotten to make room: it may still
send that set again (its reply lost), and a producer forgotten would have it stored twice. A
client sends a set again within its delivery timeout (30 s by default in pylog's client, 120 s
in Kafka's), well inside. While the least recently active of MAX_PRODUCERS is this recent, a
new producer is refused (TooManyProducers)."""
RESERVED = 1024
"""While a partition remembers MAX_PRODUCERS - RESERVED producers or more, a new producer of a
client id that holds RESERVED of them or more takes the place of that client id's least
recently active one if that one stored nothing for PROTECTED_S, and is refused otherwise: the
last RESERVED places are kept for the other client ids. (Counted among the producers this
leader let in since it opened the partition: those read from the disk or copied from a
leader are no one's.)"""
_SEQUENCES = 2**32


class StoredSet(NamedTuple):
    """An idempotent producer's set as stored: what PRODUCE answered, and where it ends."""

    producer_id: int
    producer_epoch: int
    sequence: int
    offset: int
    end: int
    message_count: int


def producers_path(directory: Path, base_offset: int) -> Path:
    """The producer entries of the segment at `base_offset`."""
    return directory / segment_file_name(base_offset, PRODUCERS_SUFFIX)


class ProducerStates:
    """The last set stored by each idempotent producer of one partition folder, and the
    active segment's entries file. Use `load`."""

    def __init__(
        self, directory: Path, base_offset: int, name: str, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._directory = directory
        self._clock = clock
        self._name = name
        """The partition's name (`<topic>-<number>`), for errors."""
        self._path = producers_path(directory, base_offset)
        """The entries file of the segment the next entry goes to (made once: each reopen of
        a released handle built it)."""
        self._last: dict[int, StoredSet] = {}
        """Each producer's last set, the least recently stored first."""
        self._stored_at: dict[int, float] = {}
        """When (clock.monotonic) each producer last stored a set here (or the state was read,
        for those read from the file: a restart protects them PROTECTED_S again)."""
        self._client_of: dict[int, int] = {}
        """The client id (its hash) that let each producer in, for those let in here."""
        self._held: dict[int, dict[int, None]] = {}
        """Per client id (its hash), the producers it let in, the least recently stored first."""
        self._joining: tuple[int, int] | None = None
        """(producer id, client id's hash) of the new producer `check` let in last, held by
        that client once `record` remembers it."""
        self._fd: int | None = None
        """The entries file's write handle, registered in OPEN_FILES (broker.log.files), which
        may release it: a worker of 10,000 partitions written by idempotent producers held
        10,000 otherwise, whatever max_open_files said."""
        self._key = (self, "producers")
        self._unsynced = False
        self._created = False
        """Whether the entries file was created since the last sync: its folder's entry for it
        is durable only once the folder is synced too."""

    @classmethod
    def load(
        cls,
        directory: Path,
        bases: Iterable[int],
        log_end: int,
        name: str,
        clock: Clock = SYSTEM_CLOCK,
        files: Collection[str] | None = None,
    ) -> ProducerStates:
        """The state of the folder whose segments start at `bases` and whose log ends at
        `log_end`: the last segment's entries, those past the log end (and a torn one) cut
        from its file. Files of no segment (left by a crash as segments were deleted, or by
        segments recovery set aside) are deleted. `files`: the folder's file names, when the
        caller has just listed it (None: listed here)."""
        bases = sorted(bases)
        states = cls(directory, bases[-1], name, clock)
        known = {segment_file_name(base, PRODUCERS_SUFFIX) for base in bases}
        for file in os.listdir(directory) if files is None else files:
            if file.endswith(PRODUCERS_SUFFIX) and file not in known:
                with contextlib.suppress(FileNotFoundError):
                    (directory / file).unlink()
        if files is None or states._path.name in files:
            states._reload(log_end)
        return states

    @property
    def producers(self) -> int:
        """How many producers are remembered."""
        return len(self._last)

    def last(self, producer_id: int) -> StoredSet | None:
        """The last set stored of `producer_id`, if it is remembered."""
        return self._last.get(producer_id)

    # -- the rules ---------------------------------------------------------------------------

    def check(
        self,
        producer_id: int,
        epoch: int,
        sequence: int,
        client: Callable[[], str] | None = None,
    ) -> StoredSet | None:
        """The stored set that a set of (`producer_id`, `epoch`, `sequence`) repeats, or None
        when it is to be appended. Raises OutOfOrderSequence, InvalidProducerEpoch,
        DuplicateSequence and TooManyProducers as the module says. `client` gives the client
        id of the request (asked only for a new producer): a leader's share of places."""
        last = self._last.get(producer_id)
        if last is None:  # a producer starts at 0, when there is room for it
            if sequence:
                raise UnknownProducerId(self._name, producer_id, epoch, sequence)
            self._check_room()
            if client is not None:
                self._check_share(producer_id, client())
            return None
        if epoch > last.producer_epoch:  # a newer epoch starts at 0 too
            if sequence:
                raise OutOfOrderSequence(self._name, producer_id, epoch, sequence, 0)
            return None
        if epoch < last.producer_epoch:
            raise InvalidProducerEpoch(self._name, producer_id, epoch, last.producer_epoch)
        ahead = (sequence - last.sequence) % _SEQUENCES
        if ahead == 1:
            return None
        if ahead == 0:
            return last
        expected = (last.sequence + 1) % _SEQUENCES
        if ahead < _SEQUENCES // 2:
            raise OutOfOrderSequence(self._name, producer_id, epoch, sequence, expected)
        found = self._find(producer_id, epoch, sequence)
        if found is not None:
            return found
        if sequence > last.sequence and not self._wrapped(producer_id, epoch, last.sequence):
            # before the last only modulo 2^32 (2^32 - 1 after 0): never sent, as the
            # producer's sequences have not wrapped
            raise OutOfOrderSequence(self._name, producer_id, epoch, sequence, expected)
        raise DuplicateSequence(self._name, producer_id, epoch, sequence)

    def _check_room(self) -> None:
        """TooManyProducers when MAX_PRODUCERS are remembered and the least recently active
        stored a set within PROTECTED_S: none may be forgotten for a new one."""
        if len(self._last) < MAX_PRODUCERS:
            return
        oldest = next(iter(self._last))
        if self._clock.monotonic() - self._stored_at[oldest] < PROTECTED_S:
            raise TooManyProducers(self._name, MAX_PRODUCERS, PROTECTED_S)

    def _check_share(self, producer_id: int, client: str) -> None:
        """Let `producer_id` in as `client`'s, within its share (RESERVED): TooManyProducers
        when the partition's last places are reserved and `client` holds its share, each of
        them active within PROTECTED_S; if its least recently active one was idle that long,
        that one is forgotten in its place."""
        key = hash(client)
        held = self._held.get(key)
        reserved = len(self._last) >= MAX_PRODUCERS - RESERVED
        if reserved and held is not None and len(held) >= RESERVED:
            own_oldest = next(iter(held))
            if self._clock.monotonic() - self._stored_at[own_oldest] < PROTECTED_S:
                raise TooManyProducers(
                    self._name, len(self._last), PROTECTED_S, client, len(held), RESERVED
                )
            self._forget(own_oldest)
        self._joining = (producer_id, key)

    def _wrapped(self, producer_id: int, epoch: int, last: int) -> bool:
        """Whether the sequences of `producer_id` at `epoch` have wrapped, as far as the
        entries files (snapshots included) tell: their earliest entry of it is above `last`,
        the producer's last sequence (a set sent before 2^32 - 1 came and 0 again)."""
        prefix = _KEY.pack(producer_id, epoch, 0)[:-4]
        for data in self._files(newest_first=False):
            at = _entry_at(data, prefix, last=False)
            if at >= 0:
                return int(ENTRY.unpack_from(data, at)[2]) > last
        return False

    def _find(self, producer_id: int, epoch: int, sequence: int) -> StoredSet | None:
        """The entry of an older set, looked up in the entries files, newest first."""
        key = _KEY.pack(producer_id, epoch, sequence)
        for data in self._files(newest_first=True):
            at = _entry_at(data, key, last=True)
            if at >= 0:
                return StoredSet(*ENTRY.unpack_from(data, at))
        return None

    def _files(self, newest_first: bool) -> Iterator[bytes]:
        """The bytes of each entries file of the partition, in its segments' order (or the
        newest first); StorageIOError for one that cannot be read."""
        paths = sorted(self._directory.glob(f"*{PRODUCERS_SUFFIX}"), reverse=newest_first)
        for path in paths:
            try:
                yield path.read_bytes()
            except OSError as error:
                raise storage_error(error, f"reading {path}") from error

    def sets_between(self, base_offset: int, start: int, end: int) -> tuple[StoredSet, ...]:
        """The entries of the sets in [`start`, `end`) of the segment at `base_offset` (`start`
        at or past it), in offset order, for a follower that copies those bytes: found by
        a binary search of its file (its snapshot entries all lie below the segment)."""
        path = producers_path(self._directory, base_offset)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return ()
        except OSError as error:
            raise storage_error(error, f"reading {path}") from error
        try:
            return _sets_between(fd, start, end)
        except OSError as error:
            raise storage_error(error, f"reading {path}") from error
        finally:
            os.close(fd)

    # -- writing -----------------------------------------------------------------------------

    def record(self, entries: Sequence[StoredSet]) -> dict[int, StoredSet | None]:
        """Write the entries of sets about to be appended, in one write (before their bytes),
        and remember each as its producer's last; return what each producer's last set was
        before (for `take_back`). DiskFull or StorageIOError, nothing remembered, when the
        write fails."""
        last = self._last
        if len(entries) == 1:  # a producer's set: once a PRODUCE
            (entry,) = entries
            before = {entry.producer_id: last.get(entry.producer_id)}
            self._write(ENTRY.pack(*entry))
        else:
            before = {entry.producer_id: last.get(entry.producer_id) for entry in entries}
            self._write(b"".join(ENTRY.pack(*entry) for entry in entries))
        for entry in entries:
            self._remember(entry)
        return before

    def take_back(self, entries: Sequence[StoredSet], before: dict[int, StoredSet | None]) -> None:
        """Undo `record(entries)`, their bytes not appended: the entries cut from the file,
        each producer's last set as it was `before`. DiskFull or StorageIOError when the cut
        fails."""
        path = self._path
        try:
            size = os.stat(path).st_size
            os.truncate(path, max(0, size - ENTRY.size * len(entries)))
        except OSError as error:
            raise storage_error(error, f"taking back entries of {path}") from error
        for producer_id, last in before.items():
            if last is not None:
                self._last.pop(producer_id, None)
                self._last[producer_id] = last
            else:
                self._forget(producer_id)

    def _remember(self, stored: StoredSet) -> None:
        """`stored` is its producer's last set, stored now; past MAX_PRODUCERS the least
        recently active producer is forgotten (a leader checked first that it may be:
        `check`; a follower keeps what its leader kept)."""
        last = self._last
        producer_id = stored.producer_id
        last.pop(producer_id, None)
        last[producer_id] = stored
        self._stored_at[producer_id] = self._clock.monotonic()
        client = self._client_of.get(producer_id)
        if client is not None:  # the least recently stored first among its client's too
            held = self._held[client]
            del held[producer_id]
            held[producer_id] = None
        elif self._joining is not None and self._joining[0] == producer_id:
            client = self._client_of[producer_id] = self._joining[1]
            self._held.setdefault(client, {})[producer_id] = None
        self._joining = None
        if len(last) > MAX_PRODUCERS:
            self._forget(next(iter(last)))

    def _forget(self, producer_id: int) -> None:
        """Forget `producer_id` (its entries stay in the files)."""
        del self._last[producer_id], self._stored_at[producer_id]
        client = self._client_of.pop(producer_id, None)
        if client is not None:
            held = self._held[client]
            del held[producer_id]
            if not held:
                del self._held[client]

    def _handle(self) -> int:
        """The write handle, opened (the file created) if need be. OSError as os.open's."""
        fd = self._fd
        if fd is None:
            try:
                fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
                self._created = True
            except FileExistsError:
                fd = os.open(self._path, os.O_WRONLY | os.O_APPEND)
            self._fd = fd
        OPEN_FILES.used(self._key, self._release)
        return fd

    def _release(self) -> None:
        """Close the write handle for OPEN_FILES: what it wrote is synced by the next `sync`
        through a handle opened again (an fsync covers the file, whichever descriptor wrote;
        an error of close(2) is that fsync's to report)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _write(self, data: bytes) -> None:
        try:
            fd = self._handle()
            written = os.write(fd, data)
            if written != len(data):  # a full disk mid-entry: the torn entry is cut
                os.ftruncate(fd, os.fstat(fd).st_size - written)
                raise OSError(28, "No space left on device")
        except OSError as error:
            raise storage_error(error, f"writing {self._path}") from error
        self._unsynced = True

    @property
    def unsynced(self) -> bool:
        """Whether entries were written since the last sync (or syncfs)."""
        return self._unsynced

    def sync(self) -> None:
        """Make the entries written so far durable, through a handle opened again if
        OPEN_FILES released it, and the file's entry in its folder when it was created since
        (at each flush that syncs their sets' bytes, a roll and a clean close)."""
        if self._unsynced:
            try:
                os.fdatasync(self._handle())
                if self._created:
                    fsync_directory(self._directory)
            except OSError as error:
                raise storage_error(error, f"syncing {self._path}") from error
            self.synced_by_file_system()

    def synced_by_file_system(self) -> None:
        """A syncfs of the file system made the entries and the file's creation durable."""
        self._unsynced = self._created = False

    def roll(self, base_offset: int) -> None:
        """A new segment starts at `base_offset`: its file begins with the snapshot (every
        producer's last set), written when there is one."""
        self._leave_file(base_offset)
        if self._last:
            self._write(b"".join(ENTRY.pack(*stored) for stored in self._last.values()))

    def truncate(self, base_offset: int, end: int) -> None:
        """The log was cut to `end`, in the segment at `base_offset`, the later segments
        deleted (their files with them): that segment's entries past `end` are cut and the
        state is read again from them."""
        self._leave_file(base_offset)
        self._reload(end)

    def reset(self, base_offset: int) -> None:
        """The log was emptied to start at `base_offset` (its files deleted): nothing is
        remembered."""
        self._leave_file(base_offset)
        self._clear()

    def _clear(self) -> None:
        """Remember no producer."""
        self._last.clear()
        self._stored_at.clear()
        self._client_of.clear()
        self._held.clear()

    def _leave_file(self, base_offset: int) -> None:
        """Write the segment at `base_offset`'s file from now on: the current one is closed, and
        what it holds unsynced is no `sync`'s any more (a roll synced it first when the topic
        fsyncs; a cut or an emptying deleted or cut it)."""
        self.close()
        self._path = producers_path(self._directory, base_offset)
        self._unsynced = self._created = False

    def _reload(self, log_end: int) -> None:
        """Remember what the active segment's file holds up to `log_end`, cutting the rest."""
        self._clear()
        path = self._path
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as error:
            raise storage_error(error, f"reading {path}") from error
        kept = 0
        for entry in ENTRY.iter_unpack(data[: len(data) - len(data) % ENTRY.size]):
            stored = StoredSet(*entry)
            if stored.end > log_end:
                break
            self._remember(stored)
            kept += ENTRY.size
        if kept < len(data):
            try:
                os.truncate(path, kept)
            except OSError as error:
                raise storage_error(error, f"cutting {path}") from error

    def close(self) -> None:
        """Release the file (written entries stay; `sync` first to make them durable)."""
        OPEN_FILES.closed(self._key)
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


_SEARCH_CHUNK = 64 * 1024 // ENTRY.size * ENTRY.size
"""How many bytes of entries are read at once once the first one is found."""


def _entry_at(data: bytes, key: bytes, last: bool) -> int:
    """Where the first (or `last`) whole entry starting with `key` is in `data`, entries of
    ENTRY.size back to back; -1 for none."""
    at = data.rfind(key) if last else data.find(key)
    while at >= 0 and at % ENTRY.size:
        at = data.rfind(key, 0, at + len(key) - 1) if last else data.find(key, at + 1)
    return at if at >= 0 and at + ENTRY.size <= len(data) else -1


def _sets_between(fd: int, start: int, end: int) -> tuple[StoredSet, ...]:
    """The entries in the file `fd` whose set lies in [start, end): the first at or past
    `start` found by bisection (offsets rise through the file, its snapshot below them all),
    then read in chunks while they start before `end`."""
    low, high = 0, os.fstat(fd).st_size // ENTRY.size
    while low < high:
        middle = (low + high) // 2
        if ENTRY.unpack(os.pread(fd, ENTRY.size, middle * ENTRY.size))[3] < start:
            low = middle + 1
        else:
            high = middle
    found: list[StoredSet] = []
    position = low * ENTRY.size
    while True:
        data = os.pread(fd, _SEARCH_CHUNK, position)
        for entry in ENTRY.iter_unpack(data[: len(data) - len(data) % ENTRY.size]):
            stored = StoredSet(*entry)
            if stored.end > end:
                return tuple(found)
            found.append(stored)
        if len(data) < _SEARCH_CHUNK:
            return tuple(found)
        position += len(data)
