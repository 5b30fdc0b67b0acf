"""A segment's `.log` file as this process holds it (Kafka's FileRecords under its LogSegment):
its size, the write handle, whether written bytes wait for a sync, and the read-only mapping
views are cut from.

Writes go straight to the file with os.write (no buffer of our own), so a failed write is seen
at once and undone by truncating back; whether they are synced is the caller's choice. Reads are
memoryviews of a read-only mmap, served from the OS page cache. A view stays valid after the
file is deleted or cut (the mapping keeps the old file's pages), and a file whose mapping still
has views is reported as in use. The write handle and the mapping are registered in the
process's OPEN_FILES (broker.log.files), which closes the least recently used when too many are
open; they are opened again when next needed. Not safe to share between threads.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
from pathlib import Path

from broker.log.files import OPEN_FILES
from broker.log.fsdir import fsync_directory, storage_error
from broker.log.message import Buffer

_COPY_CHUNK = 1 << 20


class SegmentFile:
    """The `.log` file at `path`, `size` bytes of it written (see the module docstring)."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._write_fd: int | None = None
        self._unsynced = False
        """Whether bytes were written since the last `sync` (the handle may be closed since)."""
        self._write_key = (self, "write")
        self._map_key = (self, "map")
        """Keys of the handles in OPEN_FILES (broker.log.files), which may release them."""
        self._map: mmap.mmap | None = None
        self._retired_maps: list[mmap.mmap] = []

    # -- writing ---------------------------------------------------------------------------

    def write(self, data: Buffer) -> None:
        """Write `data` at the end. On any error the file is truncated back and nothing
        changes (DiskFull or StorageIOError)."""
        fd = self._write_handle()
        start = self.size
        self._unsynced = True
        try:
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, memoryview(data)[written:])
        except OSError as error:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise storage_error(error, f"append to {self.path}") from error
        self.size = start + len(data)

    def _write_handle(self) -> int:
        """The write handle, opened again if OPEN_FILES released it (StorageIOError, EMFILE
        among them, when it cannot be)."""
        fd = self._write_fd
        if fd is None:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            except OSError as error:
                raise storage_error(error, f"opening {self.path} to append") from error
            self._write_fd = fd
        OPEN_FILES.used(self._write_key, self._release_write_handle)
        return fd

    def open_to_sync(self) -> None:
        """Open the write handle again if OPEN_FILES released it while written bytes wait for
        `sync`. StorageIOError (EMFILE...) when it cannot be: unlike a failed fsync, that
        leaves the page cache to be trusted."""
        if self._unsynced:
            self._write_handle()

    def sync(self) -> None:
        """fsync what was written since the last sync, through the write handle (opened again
        if it was released: fsync covers the file, whichever descriptor wrote to it)."""
        if self._unsynced:
            try:
                os.fsync(self._write_handle())
            except OSError as error:
                raise storage_error(error, f"fsync of {self.path}") from error
            self._unsynced = False

    def synced_by_file_system(self) -> None:
        """What was written so far was made durable by a syncfs of the file system holding the
        file (broker.log.flush_round), one that reported no error: `sync` has nothing left to
        do."""
        self._unsynced = False

    def cut(self, size: int) -> None:
        """Cut the file to `size` bytes, if it is longer (`size` becomes the size either way);
        nothing is fsynced. The write handle and the mapping are released first. A view of
        this file still held (a fetch reply being sent) would meet SIGBUS on a page cut off:
        while one is, the first `size` bytes are copied to `<name>.tmp` (fsynced), which is
        renamed over the file (the folder fsynced), so that the views keep the old file's
        pages (PartitionLog.open deletes a leftover `.log.tmp`). OSError as the file system
        gives it; the file is then as it was."""
        OPEN_FILES.closed(self._write_key)
        self._release_write_handle()
        if os.stat(self.path).st_size > size:
            if self.in_use():
                self._cut_by_copy(size)
            else:
                os.truncate(self.path, size)
        self.size = size

    def _cut_by_copy(self, size: int) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(self.path, "rb") as source, open(tmp, "wb") as copy:
                left = size
                while left:
                    chunk = source.read(min(left, _COPY_CHUNK))
                    if not chunk:
                        raise OSError(errno.EIO, f"{self.path} ended before byte {size}")
                    copy.write(chunk)
                    left -= len(chunk)
                copy.flush()
                os.fsync(copy.fileno())
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        fsync_directory(self.path.parent)

    # -- reading ---------------------------------------------------------------------------

    def view(self, start: int, end: int) -> memoryview:
        """Bytes [start, end) of the file, written bytes only, without copying."""
        if end <= start:
            return memoryview(b"")
        if self._map is None or len(self._map) < end:
            self._retire_map()
            try:
                with open(self.path, "rb") as f:
                    self._map = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_READ)
            except OSError as error:
                raise storage_error(error, f"mapping {self.path}") from error
        OPEN_FILES.used(self._map_key, self._release_map)
        return memoryview(self._map)[start:end]

    def in_use(self) -> bool:
        """Whether a view returned by `view` is still held somewhere."""
        self._retire_map()
        return bool(self._retired_maps)

    # -- lifetime --------------------------------------------------------------------------

    def _retire_map(self) -> None:
        """Close the mapping, and any mapping kept aside that no view uses any more."""
        OPEN_FILES.closed(self._map_key)
        self._release_map()
        still_exported = []
        for m in self._retired_maps:
            try:
                m.close()  # a no-op for one OPEN_FILES closed already
            except BufferError:
                still_exported.append(m)
        self._retired_maps = still_exported

    def _release_map(self) -> None:
        """Close the mapping (OPEN_FILES calls this), or keep it aside while views use it."""
        m, self._map = self._map, None
        if m is not None and not OPEN_FILES.close_mapping(m):
            self._retired_maps.append(m)

    def _release_write_handle(self) -> None:
        """Close the write handle for OPEN_FILES; an error of close(2) is the next fsync's to
        report (what was written stays in the page cache, and `sync` still fsyncs it)."""
        fd, self._write_fd = self._write_fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_write_handle(self) -> None:
        """Release the write handle (the next write opens it again). StorageIOError when
        close(2) reports an error; the handle is released all the same."""
        OPEN_FILES.closed(self._write_key)
        fd, self._write_fd = self._write_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as error:
                raise storage_error(error, f"closing {self.path}") from error

    def close(self) -> None:
        """Release the write handle and any mapping no view still uses."""
        try:
            self.close_write_handle()
        finally:
            self._retire_map()
