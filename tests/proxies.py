"""A TCP proxy that tests freeze, as a network partition would: between a broker and its
ZooKeeper, or between brokers."""

from __future__ import annotations

import selectors
import socket
import threading


class FreezableProxy:
    """A TCP proxy on 127.0.0.1 to `target`; `freeze()` stops it forwarding (the connections
    stay open, their bytes unsent), as a network partition would; `thaw()` forwards again."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def freeze(self) -> None:
        self.frozen.set()

    def thaw(self) -> None:
        self.frozen.clear()

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        peers: dict[socket.socket, socket.socket] = {}
        held: set[socket.socket] = set()  # unread while frozen
        while not self.closed.is_set():
            if held and not self.frozen.is_set():
                for end in held:
                    selector.register(end, selectors.EVENT_READ)
                held.clear()
            for key, _ in selector.select(0.05):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self.listener:
                    client, _ = self.listener.accept()
                    upstream = socket.create_connection(self.target)
                    peers[client], peers[upstream] = upstream, client
                    selector.register(client, selectors.EVENT_READ)
                    selector.register(upstream, selectors.EVENT_READ)
                    continue
                if self.frozen.is_set():
                    selector.unregister(sock)  # read nothing more: the bytes stay unsent
                    held.add(sock)
                    continue
                data = sock.recv(65536)
                if data:
                    peers[sock].sendall(data)
                    continue
                for end in (sock, peers.pop(sock)):
                    selector.unregister(end)
                    end.close()
        selector.close()

    def close(self) -> None:
        self.closed.set()
        self.thread.join(5)
        self.listener.close()
