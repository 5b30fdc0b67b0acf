"""MULTI_FETCH requests whose parts span workers: their shares in the workers, and the answers
joined into one reply (docs/protocol.md, MULTI_FETCH).

A MULTI_FETCH whose parts are all held by one worker goes to it as it came and is answered by
it alone (broker.reads). One whose parts span workers is split by the front into one
MULTI_FETCH a worker, a share, holding that worker's parts in the request's order, its
max_bytes the request's divided among the shares; each goes behind the tag FETCH_JOINED + the
join's id (u64) and carries its share's number as its correlation_id. The long poll ends for
the request when it ends for any share: once a share is answered (with data, an error, or at
the end of its wait) the front asks the workers of the others to answer theirs now
(`answered` says which: control.WakeFetch), so a request waits no longer than its first
share. Once every share is answered the join's reply is made (`take_done`).

A part that the front refuses itself (an unknown partition, an ACL, a worker restarting) is
answered at once with its error; a share whose worker exits before answering is answered
PARTITION_UNAVAILABLE, part by part (a fetch may be sent again). Not safe to share between
threads: the front's loop alone uses it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from broker import protocol
from broker.errors import BrokerError, MalformedReply, PartitionUnavailable
from broker.joins import OpenJoins
from broker.log.message import Buffer
from broker.transport import FETCH_JOINED

log = logging.getLogger("pylog.front")


@dataclass(slots=True)
class Share:
    """The parts of a join one worker serves: their indexes in the request, in order."""

    worker: int
    restarts: int
    """The worker's restarts when the share was routed (a later incarnation never answers)."""
    indexes: list[int] = field(default_factory=list)
    answered: bool = False


@dataclass(slots=True)
class FetchJoin:
    """One MULTI_FETCH in the workers: whom to answer, its parts' answers so far, its shares."""

    join_id: int
    tagged: bytes
    """The tagged identity of the client's request (throttled: broker.transport)."""
    correlation_id: int
    request: protocol.MultiFetchRequest
    throttle_ms: int
    answers: list[protocol.FetchPartReply | None]
    version: int = 1
    """The request's api_version, its reply's (a version 2 request split in shares begins no
    fetch session: its reply says session 0)."""
    shares: list[Share] = field(default_factory=list)
    waiting: int = 0
    """Shares not answered yet."""


class FetchJoins(OpenJoins[FetchJoin]):
    """The MULTI_FETCH requests whose shares the workers have not all answered."""

    def __init__(self) -> None:
        super().__init__(FETCH_JOINED)

    def open(
        self,
        tagged: bytes,
        correlation_id: int,
        request: protocol.MultiFetchRequest,
        throttle_ms: int,
        version: int = 1,
    ) -> FetchJoin:
        """A new join for `request` (of api_version `version`), with no shares yet (`share`,
        then `close`)."""
        join = FetchJoin(
            self._new_id(),
            tagged,
            correlation_id,
            request,
            throttle_ms,
            [None] * len(request.parts),
            version,
        )
        self._add(join)
        return join

    def share(self, join: FetchJoin, worker: int, restarts: int) -> Share:
        """The share of worker `worker` (of `restarts` restarts now), new if it has none."""
        for share in join.shares:
            if share.worker == worker:
                return share
        share = Share(worker, restarts)
        join.shares.append(share)
        join.waiting += 1
        return share

    def requests(self, join: FetchJoin) -> Iterator[tuple[Share, protocol.MultiFetchRequest]]:
        """Each share's MULTI_FETCH: its parts, the request's max_bytes divided among them; no
        wait when the front answered a part with its error (an error answers at once)."""
        request = join.request
        max_bytes = max(1, request.max_bytes // max(1, len(join.shares)))
        refused = any(answer is not None for answer in join.answers)
        max_wait_ms = 0 if refused else request.max_wait_ms
        for share in join.shares:
            parts = tuple(request.parts[i] for i in share.indexes)
            yield (
                share,
                protocol.MultiFetchRequest(
                    request.replica_id, max_wait_ms, request.min_bytes, max_bytes, parts
                ),
            )

    def close(self, join: FetchJoin) -> None:
        """Every part is routed or answered: a join with no share left is done."""
        if not join.waiting:
            self._finished(join)

    def answer_error(self, join: FetchJoin, index: int, error: Exception) -> None:
        """Part `index` is answered with `error`, as a FETCH would be."""
        part = join.request.parts[index]
        join.answers[index] = protocol.fetch_part_reply(
            part.topic, part.partition, protocol.encode_error(0, error)
        )

    def answered(self, tag: bytes, frame: Buffer) -> list[int]:
        """A worker's reply (one frame) to a share of tag `tag` (FETCH_JOINED + id): its
        correlation_id is the share's number. The workers whose shares are still waiting:
        the front wakes them. Dropped when the join is gone (answered already)."""
        join = self._by_tag(tag)
        if join is None:
            return []
        reply = bytes(frame)
        number = int.from_bytes(reply[:4], "big")  # the reply header's correlation_id
        if number >= len(join.shares) or join.shares[number].answered:
            return []
        share = join.shares[number]
        try:
            parts = protocol.decode_reply(protocol.Api.MULTI_FETCH, [reply]).parts
            if len(parts) != len(share.indexes):
                raise MalformedReply(f"{len(parts)} parts answer a share of {len(share.indexes)}")
            for index, answer in zip(share.indexes, parts, strict=True):
                join.answers[index] = answer
        except (BrokerError, MalformedReply) as error:  # the share as a whole failed
            if isinstance(error, MalformedReply):
                log.error("worker %d answered a MULTI_FETCH share: %s", share.worker, error)
            for index in share.indexes:
                asked = join.request.parts[index]
                join.answers[index] = protocol.FetchPartReply(
                    asked.topic, asked.partition, protocol.part_reply(reply), b""
                )
        return self._share_done(join, share)

    def _share_done(self, join: FetchJoin, share: Share) -> list[int]:
        share.answered = True
        join.waiting -= 1
        if not join.waiting:
            self._finished(join)
            return []
        return [s.worker for s in join.shares if not s.answered]

    def worker_gone(self, running: dict[int, int]) -> None:
        """Answer PARTITION_UNAVAILABLE every part of a share routed to a worker that is not
        running its incarnation of then any more: `running` maps each worker index connected
        now to its restarts."""
        for join in list(self._joins.values()):
            for share in join.shares:
                if share.answered or running.get(share.worker) == share.restarts:
                    continue
                for index in share.indexes:
                    part = join.request.parts[index]
                    error = PartitionUnavailable(
                        f"the worker for {part.topic}-{part.partition} exited before "
                        "answering: fetch again"
                    )
                    self.answer_error(join, index, error)
                self._share_done(join, share)

    def take_done(self) -> Iterator[tuple[bytes, list[Buffer], int]]:
        """The joins whose every part is answered, each as (tagged identity, reply frames,
        bytes of messages in it), forgotten from then on."""
        for join in self._take_finished():
            parts = tuple(answer for answer in join.answers if answer is not None)
            reply = protocol.MultiFetchReply(parts, join.throttle_ms)
            size = sum(len(part.message_set) for part in parts)
            frames = protocol.encode_reply(join.correlation_id, reply, join.version)
            yield join.tagged, frames, size
