"""A TCP proxy that tests freeze, as a network partition would: between a broker and its
ZooKeeper, or between brokers (all its connections, or those of some processes)."""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

Cut = Callable[[tuple[str, int]], bool]
"""Whether to freeze a connection, given its client's address as the proxy sees it."""


def socket_inode(local_port: int, remote_port: int) -> str | None:
    """The inode of the IPv4 TCP socket from `local_port` to `remote_port` on 127.0.0.1 (any
    state), from /proc/net/tcp; None when there is none."""
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, remote = (int(fields[i].rsplit(":", 1)[1], 16) for i in (1, 2))
            if (local, remote) == (local_port, remote_port):
                return fields[9]
    return None


def holds(pid: int, inode: str) -> bool:
    """Whether process `pid` has socket `inode` open (False once it is gone)."""
    wanted = f"socket:[{inode}]"
    with contextlib.suppress(OSError):
        return any(os.readlink(fd) == wanted for fd in Path(f"/proc/{pid}/fd").iterdir())
    return False


class FreezableProxy:
    """A TCP proxy on 127.0.0.1 to `target`. `freeze(cut)` stops forwarding, both ways, on
    each connection whose client address `cut` picks (every one without a `cut`; asked once
    per freeze, as it is made for the connections open, as they come for new ones), leaving it
    open with its bytes unsent; the others go on. `thaw()` forwards the frozen ones again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.closed = threading.Event()
        self._cut: Cut | None = None
        self._generation = 0
        """Raised by each freeze and thaw; the proxy's thread applies each in turn."""
        self._applied = 0
        self._changed = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def freeze(self, cut: Cut | None = None) -> None:
        """Freeze the connections `cut` picks (None: every one); in effect when it returns."""
        self._change(cut or (lambda client: True))

    def thaw(self) -> None:
        self._change(None)

    def _change(self, cut: Cut | None) -> None:
        with self._changed:
            self._cut = cut
            self._generation += 1
            generation = self._generation
            applied = self._changed.wait_for(lambda: self._applied >= generation, 10)
        assert applied, "the proxy's thread did not apply a freeze or thaw within 10 s"

    def from_processes(self, pids: Callable[[], Iterable[int]]) -> Cut:
        """A `cut` picking the connections whose client end is a socket that one of `pids()`
        holds (/proc/net/tcp gives the socket's inode, /proc/<pid>/fd who holds it)."""

        def cut(client: tuple[str, int]) -> bool:
            inode = socket_inode(client[1], self.port)
            return inode is not None and any(holds(pid, inode) for pid in pids())

        return cut

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        peers: dict[socket.socket, socket.socket] = {}
        clients: dict[socket.socket, tuple[str, int]] = {}
        frozen: set[socket.socket] = set()  # client ends of frozen connections
        cut: Cut | None = None

        def hold(client: socket.socket, frozen_now: bool) -> None:
            if frozen_now == (client in frozen):
                return
            for end in (client, peers[client]):
                if frozen_now:
                    selector.unregister(end)  # read nothing more: the bytes stay unsent
                else:
                    selector.register(end, selectors.EVENT_READ)
            (frozen.add if frozen_now else frozen.discard)(client)

        generation = 0
        while not self.closed.is_set():
            with self._changed:
                if generation != self._generation:
                    cut, generation = self._cut, self._generation
                    for client, address in clients.items():
                        hold(client, cut is not None and cut(address))
                    self._applied = generation
                    self._changed.notify_all()
            for key, _ in selector.select(0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    client, address = self.listener.accept()
                    upstream = socket.create_connection(self.target)
                    peers[client], peers[upstream] = upstream, client
                    clients[client] = address
                    if cut is not None and cut(address):
                        frozen.add(client)
                    else:
                        selector.register(client, selectors.EVENT_READ)
                        selector.register(upstream, selectors.EVENT_READ)
                    continue
                if sock not in peers:  # closed with its peer earlier in this round
                    continue
                with contextlib.suppress(OSError):  # a reset, either way: closed
                    data = sock.recv(65536)
                    if data:
                        peers[sock].sendall(data)
                        continue
                other = peers.pop(sock)
                del peers[other]
                for end in (sock, other):
                    selector.unregister(end)
                    clients.pop(end, None)
                    end.close()
        selector.close()

    def close(self) -> None:
        self.closed.set()
        self.thread.join(5)
        self.listener.close()
