"""pylog's producer or consumer run with the code of several git revisions, alternating: the
before and after of a change, measured in one run.

    .venv/bin/python perf/compare.py REV [REV ...] [--repeat 3] [--messages 200000]
        [--batch 1] [--ack none|written|flushed] [--max-in-flight 5] [--consume]

Each REV (a commit, a branch, HEAD~2; "." is the working tree as it is now) is exported with
`git archive` into a temporary directory. Then, `--repeat` times, each revision in turn runs
perf/pylog_runs.py's `produce` (or, with `--consume`, `consume` after a batch-50 load) in a
process of its own whose broker, client and pylogd come from that revision's tree (the venv's
packages are shared). Prints one JSON line per run and one line of medians per revision.
Revisions older than perf/pylog_runs.py cannot be measured, nor, with --max-in-flight, those
older than its `max_in_flight` parameter. Run it alone: on 2 cores anything
beside it skews the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUN_TIMEOUT_S = 900


CODEC = Path("broker") / "log" / "_codec.c"
BUILD_CODEC = (
    "import sys; from setuptools import Extension, setup; "
    "setup(name='codec', ext_modules=[Extension('broker.log._codec', [sys.argv[1]])], "
    "script_args=['build_ext', '--build-lib', sys.argv[2], '--build-temp', '.', '--quiet'])"
)
"""Builds the C codec of a tree (argv: its _codec.c, the tree) as scripts/setup's install does,
run in a folder of its own: setuptools would read the tree's pyproject.toml otherwise."""


def export(revision: str, into: Path) -> Path:
    """The tree of `revision` (the working tree for "."), as a directory, with its C codec
    built as the working tree's is: a revision run without it would run the pure-Python
    codec and be measured slower than it is."""
    if revision == ".":
        return ROOT
    into.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    if any((ROOT / CODEC.parent).glob("_codec*.so")) and (into / CODEC).exists():
        build = into.with_name(f"{into.name}-build")
        build.mkdir()
        command = [sys.executable, "-c", BUILD_CODEC, str(into / CODEC), str(into)]
        subprocess.run(command, cwd=build, check=True, capture_output=True)
    return into


def run_in_tree(revision: str, tree: Path, script: str, flags: list[str]) -> dict[str, Any]:
    """`script --run flags` in a process of its own whose code is `tree`'s: the JSON object of
    its last line. Exits naming `revision` if the run fails or ran other code."""
    # cwd is the tree: pylogd starts its workers with `python -m`, which looks there first.
    # The script itself is this tree's, which older trees may not have.
    done = subprocess.run(
        [sys.executable, str(Path(script).resolve()), "--run", *flags],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    if done.returncode != 0:
        sys.exit(f"{revision}: the run failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    if Path(result["code"]) != tree:
        sys.exit(f"{revision}: ran the code in {result['code']}, not {tree}")
    return result


def each_revision(
    revisions: list[str], script: str, args: argparse.Namespace, *names: str
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each revision's run of `script` (run_in_tree, in an export of the revision), with the
    options `names` of `args` passed on; each result printed as a JSON line as it comes. (For
    the driving process only: the `--run` process imports the revision's own perf/.)"""
    flags = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in names]
    with tempfile.TemporaryDirectory() as work:
        for i, revision in enumerate(revisions):
            tree = export(revision, Path(work) / f"tree{i}")
            result = run_in_tree(revision, tree, script, flags)
            print(json.dumps({"revision": revision, **result}), flush=True)
            yield revision, result


def run_one(args: argparse.Namespace) -> dict[str, Any]:
    """One run, in this process, with the code found first on sys.path (the tree's)."""
    import broker
    from broker.protocol import Ack
    from perf.pylog_runs import PrivatePylogd, consume, fresh_topic, produce

    with (
        tempfile.TemporaryDirectory() as data,
        PrivatePylogd(Path(data)) as pylogd,
        fresh_topic(pylogd.endpoint, "compare") as topic,
    ):
        if args.consume:
            produce(pylogd, topic, args.messages, 50, Ack.NONE)
            result = consume(pylogd, topic, args.messages)
        else:
            ack = Ack[args.ack.upper()]
            extra = {"max_in_flight": args.max_in_flight} if args.max_in_flight else {}
            result = produce(pylogd, topic, args.messages, args.batch, ack, **extra)
    result["msgs_per_s"] = round(result["messages"] / result["seconds"])
    result["code"] = str(Path(broker.__file__).parent.parent)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revisions", nargs="*")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--ack", choices=["none", "written", "flushed"], default="none")
    parser.add_argument(
        "--max-in-flight", type=int, default=0, help="batches awaiting acks (default: the run's)"
    )
    parser.add_argument("--consume", action="store_true")
    parser.add_argument("--run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_one(args)))
        return
    if not args.revisions:
        parser.error("name at least one revision")
    flags = [f"--messages={args.messages}", f"--batch={args.batch}", f"--ack={args.ack}"]
    flags += [f"--max-in-flight={args.max_in_flight}"] if args.max_in_flight else []
    flags += ["--consume"] if args.consume else []
    rates: dict[str, list[int]] = {revision: [] for revision in args.revisions}
    with tempfile.TemporaryDirectory() as work:
        trees = {r: export(r, Path(work) / f"tree{i}") for i, r in enumerate(args.revisions)}
        for _ in range(args.repeat):
            for revision, tree in trees.items():
                result = run_in_tree(revision, tree, __file__, flags)
                rates[revision].append(result["msgs_per_s"])
                print(json.dumps({"revision": revision, **result}), flush=True)
    what = "consume" if args.consume else f"produce batch {args.batch} ack {args.ack}"
    what += f", {args.max_in_flight} in flight" if args.max_in_flight else ""
    for revision, values in rates.items():
        median = round(statistics.median(values))
        print(f"{revision}: median {median:,} msg/s over {len(values)} runs ({what})")


if __name__ == "__main__":
    main()
