"""The worker pool: pylogd's worker processes, the DEALER that talks to each, their restarts.

Workers are child processes the supervisor forks (broker.worker.run_forked: no new interpreter,
so no 0.2 s of imports a start), `workers_per_dir` of them for each log dir, numbered log dir by
log dir (broker.placement); `ps` names them pylog-worker-<index>. Each has a DEALER bound on an
ipc endpoint under <data_dir>/run, registered in the front's poller; the front reads it (the
pool only sends). One that dies is restarted, logged and counted, after a back-off of 0.1 s
doubling to 2 s (MAX_BACKOFF_S); only a crash loop, more than CRASH_LOOP_RESTARTS restarts in a
row, waits longer, doubling to 30 s; 10 s of good health start it again from 0.1 s. Requests in
flight at the moment a worker dies get no reply: clients time out and retry. Children die with
pylogd, even when it is killed (broker.processes).

Requests routed to a worker wait in its outbox until the front has drained its client socket,
then go as one REQUESTS message (broker.transport). The pool counts the bytes of the requests
routed to each worker until the worker gives them back (CREDIT, once served), a FETCH as the
reply it may bring (broker.transport.request_weight): `queued_bytes`, what the front weighs
against broker.queued_request_bytes before it reads more requests. The
pool never calls into the front: what it must answer itself (the requests of a worker that has
gone, PARTITION_UNAVAILABLE) it puts in `answers`, a queue the front sends from on its loop.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import subprocess
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from broker import protocol
from broker.backoff import Backoff
from broker.config import BrokerConfig
from broker.errors import PartitionUnavailable
from broker.log.message import Buffer
from broker.ratelog import RateLimitedLog
from broker.transport import request_weight, requests_frame
from broker.zmqio import NOBLOCK, receive_routed, send_frames

log = logging.getLogger("pylog.supervisor")

FIRST_BACKOFF_S = 0.1
MAX_BACKOFF_S = 2.0
"""The longest wait before a worker's restart, but in a crash loop: well within the retry budget
of clients (the Producer's delivery_timeout_s, 30 s by default)."""
CRASH_LOOP_RESTARTS = 10
"""Restarts in a row (none after HEALTHY_AFTER_S of good health) that make a crash loop..."""
CRASH_LOOP_MAX_BACKOFF_S = 30.0
"""... whose waits go on doubling, up to this."""
HEALTHY_AFTER_S = 10.0

Answers = deque[tuple[bytes, list[Buffer]]]
"""Replies for the front to send on its loop: the tagged identity of a client, the frames."""


REFUSED_LOG_EVERY_S = 5.0


class RequestErrors:
    """The requests the supervisor answers with an error itself, before any worker serves
    them (the front: an unknown topic or partition, an ACL, a malformed request, a shutdown;
    the pool: a worker gone), by api and error code name, for broker.metrics
    (pylog_request_errors_total{worker="supervisor"}). A PRODUCE with ack none is never
    answered: it is counted the same, and logged (at most once per error code every
    REFUSED_LOG_EVERY_S, with the count left out), since its producer learns of it no other
    way (docs/protocol.md)."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}
        """api -> error code name -> requests: read by the metrics thread (copied whole)."""
        self._log = RateLimitedLog(log, REFUSED_LOG_EVERY_S)

    def refused(self, frames: Sequence[Buffer], error: BaseException) -> bool:
        """Count `error` as the answer to the request of `frames`; whether to answer it
        (False: a PRODUCE with ack none, logged instead)."""
        code = protocol.error_code_for(error).name
        api = protocol.peek_api_name(frames)
        by_code = self.counts.get(api)
        if by_code is None:
            by_code = self.counts[api] = {}
        by_code[code] = by_code.get(code, 0) + 1
        if not protocol.is_fire_and_forget(frames):
            return True
        self._log.log(logging.WARNING, code, f"a produce with ack=none was refused: {error}")
        return False


@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    """A worker as the metrics show it: whether it is connected, and its last snapshot of
    figures (broker.worker_stats; None before its first)."""

    index: int
    connected: bool
    snapshot: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """The pool's figures (broker.metrics): bytes of requests the workers owe, restarts, each
    worker's, and the requests the supervisor answered with an error itself (api, error
    code name, count)."""

    queued_bytes: int
    restarts: int
    workers: tuple[WorkerStatistics, ...]
    refused: tuple[tuple[str, str, int], ...]


class ForkedProcess:
    """A worker process the pool forked: what the pool asks of it, as of a subprocess.Popen
    (pid, poll, returncode, send_signal, kill, wait)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        """Its exit code once it has exited and been reaped (-N: killed by signal N)."""

    def poll(self) -> int | None:
        """The exit code if it has exited (reaping it), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout_s: float | None = None) -> int:
        """Its exit code once it has exited; subprocess.TimeoutExpired after `timeout_s`."""
        if self.poll() is None:
            with os.fdopen(os.pidfd_open(self.pid), "rb", buffering=0) as exited:
                if not select.select([exited], [], [], timeout_s)[0]:
                    raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout_s or 0)
        code = self.poll()
        assert code is not None
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:  # not a pid reused since it was reaped
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


@dataclass
class WorkerHandle:
    """A worker process, the DEALER that talks to it, and its restart state."""

    index: int
    log_dir: Path
    socket: zmq.Socket[bytes] | None = None
    endpoint: str = ""
    process: ForkedProcess | None = None
    connected: bool = False
    restarts: int = 0
    crashes: int = 0
    """Restarts in a row, since it last ran HEALTHY_AFTER_S."""
    backoff: Backoff = field(default_factory=lambda: Backoff(FIRST_BACKOFF_S, MAX_BACKOFF_S))
    start_at: float = 0.0
    started_at: float = 0.0
    outbox: list[Buffer] = field(default_factory=list)
    """Requests routed to it and not sent yet: tagged identity, request frame, ..."""
    queued_bytes: int = 0
    """Bytes of requests routed to it (request_weight) that it has not given back (CREDIT)."""
    stats: dict[str, Any] | None = None
    """Its last snapshot of figures (broker.worker_stats), for broker.metrics."""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class WorkerPool:
    """The workers of one broker: started by `start()`, checked (and restarted) by `check()`
    on every turn of the loop, stopped by `terminate()` then `stop()`."""

    def __init__(
        self,
        config: BrokerConfig,
        context: zmq.Context[zmq.Socket[bytes]],
        poller: zmq.Poller,
        run_dir: Path,
        answers: Answers,
    ) -> None:
        self.config = config
        self.context = context
        self.poller = poller
        self.run_dir = run_dir
        self.answers = answers
        self.fetch_max_bytes = config.broker_fetch_max_bytes
        per_dir = config.broker_workers_per_dir
        self.workers = [
            WorkerHandle(d * per_dir + k, log_dir)
            for d, log_dir in enumerate(config.log_dir_paths)
            for k in range(per_dir)
        ]
        self.errors = RequestErrors()
        self.restarts = 0
        self.stopping = False
        self.queued_bytes = 0
        """Bytes of request frames routed to workers and not given back yet, in all."""

    def start(self) -> None:
        """Start every worker (after removing the endpoints a killed pylogd left behind)."""
        self.remove_endpoints()
        for worker in self.workers:
            self._start(worker)

    def _start(self, worker: WorkerHandle) -> None:
        if worker.socket is not None:
            self.poller.unregister(worker.socket)
            worker.socket.close(linger=0)  # requests queued for the dead worker are dropped
        worker.stats = None
        worker.restarts += worker.process is not None
        worker.endpoint = f"ipc://{self.run_dir}/worker-{worker.index}-{worker.restarts}.sock"
        worker.socket = self.context.socket(zmq.DEALER)
        worker.socket.setsockopt(zmq.SNDHWM, 0)
        worker.socket.setsockopt(zmq.RCVHWM, 0)
        worker.socket.bind(worker.endpoint)
        self.poller.register(worker.socket, zmq.POLLIN)
        worker.connected = False
        worker.started_at = time.monotonic()
        # Imported at the first start, not with the pool: the supervisor itself runs no trio.
        from broker.worker import run_forked

        supervisor_pid = os.getpid()
        pid = os.fork()
        if pid == 0:
            run_forked(worker.index, worker.endpoint, self.config, supervisor_pid)
        worker.process = ForkedProcess(pid)
        log.info("started worker %d (pid %d)", worker.index, worker.process.pid)

    def by_socket(self, sock: zmq.Socket[bytes]) -> WorkerHandle | None:
        """The worker whose DEALER `sock` is (None: not a worker's)."""
        return next((w for w in self.workers if w.socket is sock), None)

    def queue(self, worker: WorkerHandle, tagged: bytes, request: Buffer) -> None:
        """Route a request to `worker`: sent with the others drained in this turn (flush)."""
        worker.outbox += (tagged, request)
        size = request_weight(request, self.fetch_max_bytes)
        worker.queued_bytes += size
        self.queued_bytes += size

    def credit(self, worker: WorkerHandle, size: int) -> None:
        """`worker` has served `size` more bytes of requests."""
        size = min(size, worker.queued_bytes)  # a late credit from a worker since restarted
        worker.queued_bytes -= size
        self.queued_bytes -= size

    def send(self, worker: WorkerHandle, frames: Sequence[Buffer]) -> bool:
        """Send without blocking, after the requests waiting in the worker's outbox (a command
        never overtakes them). A DEALER whose worker has gone has no peer and would block for
        ever; then the worker counts as not connected (its exit is seen on the next check) and
        this says False."""
        self.flush(worker)
        if not worker.connected or worker.socket is None:
            return False
        try:
            send_frames(worker.socket, frames, NOBLOCK)
        except zmq.Again:
            worker.connected = False
            return False
        return True

    def flush(self, worker: WorkerHandle) -> None:
        """Send the requests routed to `worker` since the last flush as one REQUESTS message
        (broker.transport). If the worker is gone, answer each PARTITION_UNAVAILABLE (but those
        with ack none, which get no answer: counted and logged, RequestErrors)."""
        outbox = worker.outbox
        if not outbox:
            return
        worker.outbox = []
        if self.send(worker, [requests_frame(len(outbox) // 2), *outbox]):
            return
        error = PartitionUnavailable(f"worker {worker.index} is restarting; retry shortly")
        for tagged, request in zip(outbox[::2], outbox[1::2], strict=True):
            if self.errors.refused([request], error):
                correlation_id = protocol.peek_correlation_id([request])
                self.answers.append((bytes(tagged), protocol.encode_error(correlation_id, error)))

    def flush_all(self) -> None:
        for worker in self.workers:
            self.flush(worker)

    def check(self) -> None:
        """Note the workers that exited, and start again those whose back-off is over."""
        now = time.monotonic()
        for worker in self.workers:
            process = worker.process
            if process is not None and process.poll() is not None and worker.start_at <= 0:
                worker.connected = False
                # What it owed went with it: not held against every client until its restart,
                # which a crash loop puts off for up to 30 s.
                self.queued_bytes -= worker.queued_bytes
                worker.queued_bytes = 0
                if self.stopping:
                    continue
                self.restarts += 1
                if now - worker.started_at > HEALTHY_AFTER_S:
                    worker.backoff.reset()
                    worker.crashes = 0
                worker.crashes += 1
                crash_loop = worker.crashes >= CRASH_LOOP_RESTARTS
                worker.backoff.max_s = CRASH_LOOP_MAX_BACKOFF_S if crash_loop else MAX_BACKOFF_S
                wait_s = worker.backoff.next()
                worker.start_at = now + wait_s
                log.error(
                    "worker %d (pid %d) exited with %s; restarting in %.1f s (restart %d)",
                    worker.index,
                    process.pid,
                    process.returncode,
                    wait_s,
                    self.restarts,
                )
            if worker.start_at > 0 and now >= worker.start_at and not self.stopping:
                worker.start_at = 0.0
                self._start(worker)

    def statistics(self) -> PoolStatistics:
        """The pool's figures now (read by the metrics thread: the counts are copied whole,
        the loop may add to them meanwhile)."""
        refused = tuple(
            (api, error, count)
            for api, by_error in list(self.errors.counts.items())
            for error, count in list(by_error.items())
        )
        workers = tuple(WorkerStatistics(w.index, w.connected, w.stats) for w in self.workers)
        return PoolStatistics(self.queued_bytes, self.restarts, workers, refused)

    def all_connected(self) -> bool:
        return all(w.connected for w in self.workers)

    def terminate(self) -> None:
        """SIGTERM every running worker (each flushes and closes its logs, answering producers
        waiting on that flush); none is restarted from now on."""
        self.stopping = True
        for worker in self.workers:
            if worker.running:
                assert worker.process is not None
                worker.process.send_signal(signal.SIGTERM)

    def all_exited(self) -> bool:
        return not any(w.running for w in self.workers)

    def kill(self) -> None:
        """SIGKILL the workers still running (they did not exit in time)."""
        for worker in self.workers:
            if worker.running:
                assert worker.process is not None
                log.error("worker %d did not exit in time: killing it", worker.index)
                worker.process.kill()

    def drained(self) -> Iterator[tuple[WorkerHandle, bytes, list[zmq.Frame]]]:
        """What the workers sent and the front has not read yet (their last replies, once they
        have exited): each message's worker, first frame and other frames."""
        for worker in self.workers:
            while worker.socket is not None:
                try:
                    first, rest = receive_routed(worker.socket, NOBLOCK)
                except zmq.Again:
                    break
                yield worker, first, rest

    def stop(self, timeout_s: float) -> None:
        """SIGTERM the workers still running and wait for them, SIGKILL after `timeout_s`."""
        for worker in self.workers:
            process = worker.process
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def remove_endpoints(self) -> None:
        """Remove the workers' ipc socket files."""
        for stale in self.run_dir.glob("worker-*.sock"):
            stale.unlink(missing_ok=True)
