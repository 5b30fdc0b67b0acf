"""The message format's hot loops, their Python references (broker.log.message) against the C
extension (broker.log._codec), in one process: microseconds a message.

    .venv/bin/python perf/bench_codec.py [--sets 200] [--repeat 5]

Sets of 1,000 messages of 200 bytes on disk (no key, a 174-byte value). For each function the
two implementations run in turn, `--repeat` rounds of `--sets` sets each, alternating, and the
best round of each counts: `encode_message` (one message a call, the producer's), `scan` (the
walk of a producer's set's validation and of recovery, marks every 4 KiB), `decode` (a fetched
set into Messages, decode_fetched's), `decode_columns` (a fetched set into Arrow buffers, the
Spark source's). Prints one line a function and one JSON line. Run it alone: anything else on
2 cores skews it.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from types import ModuleType

from broker.log import _codec, message

MESSAGES = 1000
VALUE = b"v" * 174


def timed(run: Callable[[], object], sets: int) -> float:
    started = time.perf_counter()
    for _ in range(sets):
        run()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    data = b"".join(message.encode_message(VALUE, None, 1_700_000_000_000) for _ in range(MESSAGES))
    assert len(data) == 200 * MESSAGES

    def cases(impl: ModuleType) -> dict[str, Callable[[], object]]:
        encode, walk = impl.encode_message, impl.scan_walk
        decode, columns = impl.decode_set, impl.decode_columns
        return {
            "encode_message": lambda: [encode(VALUE, None, 5) for _ in range(MESSAGES)],
            "scan": lambda: message.scan_result(data, 1 << 20, walk(data, 1 << 20, 4096, 0)),
            "decode": lambda: decode(data, 0),
            "decode_columns": lambda: columns(data, 0, 1 << 62),
        }

    python, c = cases(message), cases(_codec)
    result: dict[str, object] = {"messages_a_set": MESSAGES, "message_bytes": 200}
    for name in python:
        best = {"python": float("inf"), "c": float("inf")}
        for _ in range(args.repeat):
            for impl, run in (("python", python[name]), ("c", c[name])):
                best[impl] = min(best[impl], timed(run, args.sets))
        per_message = {k: v / (args.sets * MESSAGES) * 1e6 for k, v in best.items()}
        speedup = per_message["python"] / per_message["c"]
        print(
            f"{name:15} python {per_message['python']:.3f} us  c {per_message['c']:.3f} us"
            f"  ({speedup:.1f}x)"
        )
        result[name] = {k: round(v, 4) for k, v in per_message.items()}
    result["python_version"] = platform.python_version()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
