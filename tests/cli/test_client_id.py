"""`--client-id` on the commands that produce and consume (issue 53, item 6): the brokers see
the id given (their logs, and the client quotas of a plaintext broker), where before there was
no such option and every pylogctl client was `pylog-python`."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import zmq
from click.testing import CliRunner

from broker.protocol import ErrorCode, decode_request, encode_error
from cli.pylogctl import cli


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """A ROUTER on loopback that notes each request's client id and answers it
    UNSUPPORTED_VERSION, which nothing retries: its endpoint and the ids noted."""
    context = zmq.Context()
    socket = context.socket(zmq.ROUTER)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    seen: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if not socket.poll(20):
                continue
            identity, empty, *frames = socket.recv_multipart()
            header, _ = decode_request(frames)
            seen.append(header.client_id)
            reply = encode_error(header.correlation_id, ErrorCode.UNSUPPORTED_VERSION)
            socket.send_multipart([identity, empty, *reply])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{port}", seen
    finally:
        stop.set()
        thread.join(5)
        socket.close(0)
        context.term()


@pytest.mark.parametrize(
    "command",
    [
        ["produce", "clicks"],
        ["consume", "clicks"],
        ["group", "consume", "loaders", "clicks"],
    ],
)
def test_the_brokers_see_the_client_id_given(
    listener: tuple[str, list[str]], command: list[str]
) -> None:
    endpoint, seen = listener
    arguments = [*command, "--client-id", "slowpoke", "--timeout", "1", "--broker", endpoint]
    result = CliRunner().invoke(cli, arguments, input="hello\n")
    assert result.exit_code != 0  # every request refused
    assert seen and set(seen) == {"slowpoke"}, (seen, result.output)
