"""pylogd's child processes die with it, and a port in use names its holder (Linux).

A child must not outlive pylogd, even when pylogd is killed with SIGKILL and has no chance to
stop it: it would go on holding its partitions or its port. Each child asks the kernel for
SIGTERM when its parent dies (prctl PR_SET_PDEATHSIG). A worker does so itself, first thing
(`exit_with_supervisor`); a program that cannot, the private ZooKeeper's JVM, is started
through `orphan_proof(command)`, which runs

    python -m broker.processes PARENT_PID COMMAND...

to do the same and then exec the command: the setting survives exec, so the JVM gets SIGTERM
when pylogd dies. The kernel sends it when the *thread* that forked the child ends, not the
process: start children from a thread that lasts as long as the process (pylogd forks its
workers from its main thread, and restarts its private ZooKeeper from a thread of its own that
ends only after that ZooKeeper is stopped).

`port_holder(port)` names the process listening on a TCP port, for errors that say who holds
it; `listening_pids(port)` tells whether that is the process meant to.

`ensure_file_limit(max_open_files)`, at start, before any worker is forked (they inherit it):
the process's limit of open files (RLIMIT_NOFILE, `ulimit -n`) must hold a worker's segment
files (log.max_open_files) and FDS_BESIDES_SEGMENTS more. A soft limit below that is raised to
the hard limit; a hard limit below it stops pylogd with one line that says what to change.
`segment_file_limit(max_open_files)` is the number of segment files a worker keeps open:
log.max_open_files, or without one (none, the default) as many as the limits allow.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "ensure_file_limit",
    "exit_with_supervisor",
    "listening_pids",
    "name_process",
    "orphan_proof",
    "port_holder",
    "segment_file_limit",
]

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
_NAME_BYTES = 15
"""The kernel keeps a process name (comm) of at most 15 bytes."""
_TCP_LISTEN = "0A"
_COMMAND_LINE_CHARS = 120
"""How much of a holder's command line an error shows."""


def exit_with_supervisor(supervisor_pid: int) -> None:
    """Have the kernel send this process SIGTERM when the supervisor dies (Linux), so that a
    supervisor killed with SIGKILL leaves no child behind; and exit at once if it died before
    this call."""
    _prctl("PR_SET_PDEATHSIG", PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor_pid:
        sys.exit(f"the supervisor (pid {supervisor_pid}) is gone")


def name_process(name: str) -> None:
    """Give this process the name `ps`, `top` and /proc/<pid>/comm show (Linux; its first 15
    bytes): a forked worker's command line is its supervisor's."""
    _prctl("PR_SET_NAME", PR_SET_NAME, ctypes.c_char_p(name.encode()[:_NAME_BYTES]))


def _prctl(what: str, option: int, argument: object) -> None:
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, argument, 0, 0, 0) != 0:
        log.warning("prctl(%s): %s", what, os.strerror(ctypes.get_errno()))


def orphan_proof(command: Sequence[str]) -> list[str]:
    """`command` run so that it gets SIGTERM when this process dies (see the module doc)."""
    return [sys.executable, "-m", __name__, str(os.getpid()), *command]


def listening_pids(port: int) -> set[int]:
    """The processes with a TCP socket listening on `port` (any address) that this process
    may look into (its own user's, or all as root)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as file:
            next(file)
            for line in file:
                fields = line.split()
                if fields[3] == _TCP_LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    pids = set()
    if inodes:
        for fd_dir in Path("/proc").glob("[0-9]*/fd"):
            with contextlib.suppress(OSError):  # gone meanwhile, or not ours to look into
                if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                    pids.add(int(fd_dir.parent.name))
    return pids


def port_holder(port: int) -> str:
    """Who listens on `port`, for an error message: "pid 123 (java -Xmx512m ...)", or "a
    process this one cannot see" (another user's)."""
    holders = []
    for pid in sorted(listening_pids(port)):
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        command = raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        if len(command) > _COMMAND_LINE_CHARS:
            command = command[: _COMMAND_LINE_CHARS - 3] + "..."
        holders.append(f"pid {pid} ({command})")
    return ", ".join(holders) or "a process this one cannot see"


FDS_BESIDES_SEGMENTS = 128
"""File descriptors a pylogd process needs besides its segment files: its ZeroMQ sockets and
their mailboxes, the supervisor's client connections, checkpoint and epoch files being written,
mappings kept open while a reply still sends them (broker.log.files), its log."""
UNLIMITED_SOFT_LIMIT = 1 << 20
"""The soft limit set when the hard one is unlimited (systemd's LimitNOFILE=1048576)."""


MAP_COUNT_PATH = Path("/proc/sys/vm/max_map_count")
DEFAULT_MAP_COUNT = 65_530
"""Linux's default vm.max_map_count, taken where /proc does not say."""


def segment_file_limit(max_open_files: int | None) -> int:
    """The segment files a worker keeps open at most: `max_open_files` (log.max_open_files)
    when set; without one (none), what the process's limits allow: its hard limit of open files
    (which ensure_file_limit raises the soft one to) less FDS_BESIDES_SEGMENTS, and at most half
    of vm.max_map_count, the mappings a process may hold (each open segment or index file is
    one, and the rest are the interpreter's, ZeroMQ's and the kept-aside mappings'); at least 1."""
    if max_open_files is not None:
        return max_open_files
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    allowed = UNLIMITED_SOFT_LIMIT if hard == resource.RLIM_INFINITY else hard
    try:
        map_count = int(MAP_COUNT_PATH.read_text())
    except (OSError, ValueError):
        map_count = DEFAULT_MAP_COUNT
    return max(1, min(allowed - FDS_BESIDES_SEGMENTS, map_count // 2))


def ensure_file_limit(max_open_files: int) -> None:
    """Make sure this process (and the workers it forks) may open `max_open_files` segment
    files and FDS_BESIDES_SEGMENTS more: a lower soft limit is raised to the hard limit (and
    logged); OSError, saying what to change, when the hard limit is lower too."""
    needed = max_open_files + FDS_BESIDES_SEGMENTS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise OSError(
            f"log.max_open_files is {max_open_files}: a worker needs up to {needed} file "
            f"descriptors, but this process may open {soft} (ulimit -n; hard limit {hard}). "
            f"Raise the limit (LimitNOFILE= in the systemd unit, or ulimit -n {needed} before "
            "starting pylogd), or lower log.max_open_files to at most "
            f"{max(1, hard - FDS_BESIDES_SEGMENTS)}"
        )
    target = UNLIMITED_SOFT_LIMIT if hard == resource.RLIM_INFINITY else hard
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(target, needed), hard))
    log.info(
        "open files: soft limit raised from %d to %d (log.max_open_files %d needs %d)",
        soft,
        max(target, needed),
        max_open_files,
        needed,
    )


def main(argv: Sequence[str]) -> None:
    """PARENT_PID COMMAND...: die with PARENT_PID, then become COMMAND."""
    parent, *command = argv
    exit_with_supervisor(int(parent))
    try:
        os.execvp(command[0], command)
    except OSError as error:
        sys.exit(f"cannot run {command[0]}: {error}")


if __name__ == "__main__":
    main(sys.argv[1:])
