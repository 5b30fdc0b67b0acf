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
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["exit_with_supervisor", "listening_pids", "orphan_proof", "port_holder"]

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
_TCP_LISTEN = "0A"
_COMMAND_LINE_CHARS = 120
"""How much of a holder's command line an error shows."""


def exit_with_supervisor(supervisor_pid: int) -> None:
    """Have the kernel send this process SIGTERM when the supervisor dies (Linux), so that a
    supervisor killed with SIGKILL leaves no child behind; and exit at once if it died before
    this call."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            log.warning("prctl(PR_SET_PDEATHSIG): %s", os.strerror(ctypes.get_errno()))
    if os.getppid() != supervisor_pid:
        sys.exit(f"the supervisor (pid {supervisor_pid}) is gone")


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
