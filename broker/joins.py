"""The parts of MULTI_PRODUCE requests in the workers, and their answers joined into one reply
(docs/protocol.md, MULTI_PRODUCE).

The front splits a MULTI_PRODUCE into one PRODUCE of version 3 a part, each to the worker
holding its partition, so that every rule of a partition (acks, fencing, idempotent sequences,
the storage's checks) holds per part as it holds for a PRODUCE: the worker cannot tell them
apart. Each part's request goes behind the tag JOINED + the join's id (u64) + the connection
of its client (`client_of`), and carries the part's index as its correlation_id; the worker
answers it as any other, and the front gives the answer (the reply frame after its
correlation_id: protocol.part_reply) to `answer` here instead of to a client. Once every part
is answered the join's reply is made (`take_done`).

A part that the front refuses itself (an unknown partition, an ACL, a worker restarting) is
answered at once with its error. A part routed to a worker that exits before answering it is
answered PARTITION_UNAVAILABLE (`worker_gone`): like a PRODUCE whose reply a worker's death
lost, its set may or may not have been stored (an idempotent producer's set sent again is
stored once). Not safe to share between threads: the front's loop alone uses it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final, Generic, Protocol, TypeVar

from broker import protocol
from broker.errors import PartitionUnavailable
from broker.log.message import Buffer
from broker.transport import connection_of

JOINED: Final = b"J"
"""The first byte of the tag a part's request goes to its worker behind (broker.transport's
tags of clients are R, Q, r and q)."""
_ID_BYTES: Final = 8


def client_of(tagged: bytes) -> bytes:
    """The connection a request to a worker came by, from its tagged identity: a MULTI_PRODUCE
    part's (JOINED) names it after the join's id (Joins.tag); any other's is its own
    (broker.transport.connection_of)."""
    if tagged[:1] == JOINED:
        return tagged[1 + _ID_BYTES :]
    return connection_of(tagged)


class _Joined(Protocol):
    @property
    def join_id(self) -> int: ...


J = TypeVar("J", bound=_Joined)


class OpenJoins(Generic[J]):
    """Requests split over the workers whose answers are not all in (MULTI_PRODUCE's here,
    MULTI_FETCH's in broker.fetch_joins), by id; each is found by the tag its parts go to the
    workers behind, `prefix` and its id (u64), and is forgotten once taken done."""

    def __init__(self, prefix: bytes) -> None:
        self._prefix = prefix
        self._joins: dict[int, J] = {}
        self._ids = itertools.count(1)
        self._done: list[J] = []

    def __len__(self) -> int:
        return len(self._joins)

    def _new_id(self) -> int:
        return next(self._ids)

    def _add(self, join: J) -> bytes:
        """Hold `join` until it is done; the tag of its parts."""
        self._joins[join.join_id] = join
        return self.tag(join)

    def tag(self, join: J) -> bytes:
        """The tag `join`'s parts go to the workers behind."""
        return self._prefix + join.join_id.to_bytes(_ID_BYTES, "big")

    def _by_tag(self, tag: bytes) -> J | None:
        """The join of a part's tag; None once it is done (a late answer)."""
        return self._joins.get(int.from_bytes(tag[1 : 1 + _ID_BYTES], "big"))

    def _finished(self, join: J) -> None:
        self._done.append(join)

    def _take_finished(self) -> list[J]:
        """The joins done since the last call, forgotten from now on."""
        done, self._done = self._done, []
        for join in done:
            del self._joins[join.join_id]
        return done


@dataclass(slots=True)
class Join:
    """One MULTI_PRODUCE in the workers: whom to answer, its parts, their answers so far."""

    join_id: int
    tagged: bytes
    """The tagged identity of the client's request (throttled: broker.transport)."""
    correlation_id: int
    parts: tuple[protocol.ProducePart, ...]
    throttle_ms: int
    answers: list[Buffer | None]
    waiting: int
    workers: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Part index -> (worker index, its restarts when the part was routed), until answered."""


class Joins(OpenJoins[Join]):
    """The MULTI_PRODUCE requests whose parts the workers have not all answered."""

    def __init__(self) -> None:
        super().__init__(JOINED)

    def tag(self, join: Join) -> bytes:
        """The tag of `join`'s parts: JOINED, its id and the connection of its client
        (client_of), so that a worker keeps each client's parts in the order it sent them."""
        return super().tag(join) + connection_of(join.tagged)

    def open(
        self,
        tagged: bytes,
        correlation_id: int,
        parts: tuple[protocol.ProducePart, ...],
        throttle_ms: int,
    ) -> tuple[bytes, Join]:
        """A new join for a request's `parts`: the tag its parts' requests go behind, and it."""
        join = Join(
            self._new_id(),
            tagged,
            correlation_id,
            parts,
            throttle_ms,
            [None] * len(parts),
            len(parts),
        )
        return self._add(join), join

    def routed(self, join: Join, index: int, worker: int, restarts: int) -> None:
        """Part `index` went to worker `worker` (of `restarts` restarts then)."""
        join.workers[index] = (worker, restarts)

    def answer(self, join: Join, index: int, reply: Buffer) -> None:
        """Part `index` is answered with `reply` (protocol.part_reply); a second answer to a
        part (the worker's, after worker_gone answered it) is dropped."""
        if join.answers[index] is not None:
            return
        join.answers[index] = reply
        join.workers.pop(index, None)
        join.waiting -= 1
        if not join.waiting:
            self._finished(join)

    def answer_error(self, join: Join, index: int, error: Exception) -> None:
        """Part `index` is answered with `error`, as a PRODUCE would be."""
        self.answer(join, index, protocol.part_reply(protocol.encode_error(0, error)[0]))

    def answered(self, tag: bytes, frame: Buffer) -> None:
        """A worker's reply (one frame) to a part's request of tag `tag` (JOINED + id): its
        correlation_id is the part's index. Dropped when the join is gone (answered already)."""
        join = self._by_tag(tag)
        if join is None:
            return
        reply = bytes(frame)
        index = int.from_bytes(reply[:4], "big")  # the reply header's correlation_id
        if index < len(join.parts):
            self.answer(join, index, protocol.part_reply(reply))

    def worker_gone(self, running: dict[int, int]) -> None:
        """Answer PARTITION_UNAVAILABLE every part routed to a worker that is not running its
        incarnation of then any more: `running` maps each worker index connected now to its
        restarts."""
        for join in list(self._joins.values()):
            for index, (worker, restarts) in list(join.workers.items()):
                if running.get(worker) != restarts:
                    part = join.parts[index]
                    self.answer_error(
                        join,
                        index,
                        PartitionUnavailable(
                            f"the worker for {part.topic}-{part.partition} exited before "
                            "answering: the set may or may not be stored; send it again"
                        ),
                    )

    def take_done(self) -> Iterator[tuple[bytes, list[Buffer]]]:
        """The joins whose every part is answered, each as (tagged identity, reply frames),
        forgotten from then on."""
        for join in self._take_finished():
            parts = tuple(
                protocol.PartReply(part.topic, part.partition, answer or b"")
                for part, answer in zip(join.parts, join.answers, strict=True)
            )
            reply = protocol.MultiProduceReply(parts, join.throttle_ms)
            yield join.tagged, protocol.encode_reply(join.correlation_id, reply)
