"""perf/bench_compression.py's own logic: its corpus, and a whole run at a tiny size against a
real pylogd (the figures are the benchmark's; here only that they are made and add up)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from perf.bench_compression import corpus

pytestmark = pytest.mark.broker


def test_the_corpus_is_the_same_every_run_and_looks_like_log_lines() -> None:
    lines = corpus(2000)
    assert lines == corpus(2000)
    assert all(80 <= len(line) <= 320 for line in lines)
    assert all(b'HTTP/1.1" ' in line for line in lines[::2])
    assert all(b" request_id=" in line for line in lines[1::2])
    assert len(set(lines)) == len(lines)


def test_a_tiny_run_prints_every_codec_beside_none() -> None:
    command = [sys.executable, "-m", "perf.bench_compression", "--messages", "1000", "--no-spark"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    record = json.loads(done.stdout.splitlines()[-1])
    results = record["results"]
    assert list(results) == ["none", "gzip", "lz4", "zstd"]
    assert all(
        figures["produce_per_s"] > 0 < figures["consume_per_s"] for figures in results.values()
    )
    assert results["zstd"]["bytes_per_message"] < results["none"]["bytes_per_message"] / 2
