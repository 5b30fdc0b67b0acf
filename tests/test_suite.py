"""The suite's own guards (tests/conftest.py)."""

from __future__ import annotations

import gc
import threading

import pytest
import zmq


def test_a_context_collected_with_its_open_socket_does_not_hang_the_run() -> None:
    # As a failing test leaves a client: context and socket in a cycle of garbage. pyzmq's
    # own finalizer would wait for ever here, and the run with it.
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.PAIR)
    socket.connect("tcp://127.0.0.1:9")  # a connection that never comes: a live pipe
    cycle: list[object] = [context, socket]
    cycle.append(cycle)
    del context, socket, cycle
    collected = threading.Thread(target=gc.collect, daemon=True)
    with pytest.warns(ResourceWarning, match="left to the garbage collector"):
        collected.start()
        collected.join(10)
    assert not collected.is_alive(), "the garbage collector is stuck terminating the context"
