"""`pylogctl log dump` and `pylogctl log verify` on real partition folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from broker.log import encode_message
from broker.log.compression import Codec, Compressor
from broker.log.index import OffsetIndex
from cli.pylogctl import cli
from tests.conftest import FakeClock
from tests.log.test_compression import as_inner
from tests.log.test_partition import make_set, open_log


def write_partition(directory: Path) -> None:
    log = open_log(directory, FakeClock(), segment_bytes=1000)
    log.append(encode_message(b"hello, pylog", key=b"user-42", timestamp_ms=1_700_000_000_000))
    for i in range(1, 21):
        log.append(make_set(i, 1))
    log.close()


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0x01
    path.write_bytes(bytes(data))


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_dump_prints_every_message_with_its_offset_key_and_checksum(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0")
    code, out = run("log", "dump", str(tmp_path / "t-0" / f"{0:020d}.log"))
    lines = out.splitlines()
    assert code == 0
    assert lines[0] == (
        "offset 0 size 45 time 2023-11-14T22:13:20.000+00:00 key 'user-42' "
        "value 'hello, pylog' checksum ok"
    )
    assert lines[1].startswith("offset 45 size 100 time ")
    assert len(lines) == 10  # 45 + 9 x 100 bytes before the roll at 1000


def test_dump_json_names_offsets_of_the_segment_by_its_base(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0")
    code, out = run("log", "dump", "--json", str(tmp_path / "t-0" / f"{945:020d}.log"))
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0
    assert [r["offset"] for r in records] == [945 + 100 * i for i in range(len(records))]
    assert records[0]["key"] is None and records[0]["checksum_ok"] is True
    assert records[0]["value_preview"].startswith("00000010")


def test_dump_flags_a_bad_checksum_and_exits_1(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0")
    segment = tmp_path / "t-0" / f"{0:020d}.log"
    flip_byte(segment, 40)
    code, out = run("log", "dump", "--json", str(segment))
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 1
    assert [r["checksum_ok"] for r in records[:2]] == [False, True]


def test_dump_stops_where_framing_breaks_naming_the_position(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0")
    segment = tmp_path / "t-0" / f"{0:020d}.log"
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x00\x05" + b"junk" * 8)
    code, out = run("log", "dump", str(segment))
    assert code == 1
    assert out.splitlines()[-1] == (
        "framing broken at byte 945 (offset 945): length field 5 is below the minimum 22"
    )


def test_verify_a_healthy_partition_exits_0(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0")
    code, out = run("log", "verify", str(tmp_path / "t-0"))
    assert code == 0
    assert out.splitlines()[-1] == "1 partitions, 3 segments, 21 messages: all ok"


def test_verify_a_log_dir_names_the_corrupt_file_and_position(tmp_path: Path) -> None:
    for name in ("a-0", "a-1", "b-0"):
        write_partition(tmp_path / name)
    broken = tmp_path / "a-1" / f"{945:020d}.log"
    flip_byte(broken, 250)
    code, out = run("log", "verify", "--json", str(tmp_path))
    records = [json.loads(line) for line in out.splitlines()]
    bad = [r for r in records if r.get("ok") is False]
    assert code == 1
    assert len(bad) == 1
    assert (bad[0]["file"], bad[0]["position"]) == (str(broken), 200)
    assert bad[0]["error"].startswith("checksum mismatch")
    assert records[-1]["summary"] == {
        "partitions": 3,
        "segments": 9,
        "messages": 55,  # valid ones: 3 x 21, less the 8 from the flipped byte on
        "compressed_sets_unopened": 0,
        "corrupt_segments": 1,
    }


def test_verify_reports_a_gap_between_segments(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0")
    (tmp_path / "t-0" / f"{945:020d}.log").unlink()
    code, out = run("log", "verify", str(tmp_path / "t-0"))
    assert code == 1
    assert f"CORRUPT  {tmp_path / 't-0' / f'{1945:020d}.log'} at byte 0: starts at 1945" in out


def test_verify_does_not_change_any_file(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0")
    newest = tmp_path / "t-0" / f"{1945:020d}.log"
    with open(newest, "ab") as f:
        f.write(b"torn write")
    before = {p.name: p.read_bytes() for p in (tmp_path / "t-0").iterdir()}
    code, _ = run("log", "verify", str(tmp_path / "t-0"))
    assert code == 1
    assert {p.name: p.read_bytes() for p in (tmp_path / "t-0").iterdir()} == before


def test_verify_a_folder_without_segments_is_a_usage_error(tmp_path: Path) -> None:
    code, out = run("log", "verify", str(tmp_path))
    assert code == 2
    assert "holds no segment files" in out


@pytest.mark.broker
def test_installed_pylogctl_command_runs(tmp_path: Path) -> None:
    write_partition(tmp_path / "t-0")
    pylogctl = Path(sys.executable).with_name("pylogctl")
    result = subprocess.run(
        [str(pylogctl), "log", "verify", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "1 partitions, 3 segments, 21 messages: all ok"


@pytest.mark.parametrize(
    "damage, error",
    [
        ("flipped", "is damaged: it fails its checksum"),
        ("rewritten", "disagrees with the log: entry 50 is not where a message starts"),
    ],
)
def test_verify_checks_each_index_against_its_log(tmp_path: Path, damage: str, error: str) -> None:
    write_partition(tmp_path / "t-0")
    index = tmp_path / "t-0" / f"{0:020d}.index"
    if damage == "flipped":  # a bit rotted on disk
        data = bytearray(index.read_bytes())
        data[19] ^= 0x01
        index.write_bytes(bytes(data))
    else:  # an index whose checksum holds but whose entry is inside the first message
        size = (tmp_path / "t-0" / f"{0:020d}.log").stat().st_size
        OffsetIndex([0, 50]).write(index, size)
    code, out = run("log", "verify", "--json", str(tmp_path / "t-0"))
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 1
    assert records[0]["file"] == str(tmp_path / "t-0" / f"{0:020d}.log")
    assert records[0]["ok"] is False
    assert records[0]["error"] == f"index {index.name} {error}"
    assert records[-1]["summary"]["corrupt_segments"] == 1


def write_compressed(directory: Path, damaged: bool) -> Path:
    """A segment of a plain message, then a zstd set of 3 messages whose inner set is
    damaged when `damaged` (the last message's length field past the set's end: what a broken
    producer whose set got past no check would leave), then a plain message."""
    inner = bytearray(as_inner(make_set(1, 3)))
    if damaged:
        inner[200 + 3] += 1  # the last inner message's length field
    wrapper = Compressor(Codec.ZSTD).wrap(bytes(inner), 4)
    path = directory / f"{0:020d}.log"
    directory.mkdir()
    path.write_bytes(make_set(0, 1) + wrapper + make_set(4, 1))
    return path


def test_dump_shows_a_compressed_set_and_its_messages(tmp_path: Path) -> None:
    path = write_compressed(tmp_path / "t-0", damaged=False)
    code, out = run("log", "dump", str(path))
    lines = out.splitlines()
    assert code == 0
    assert lines[1].startswith("offset 100 size ") and "compressed set: zstd" in lines[1]
    assert lines[1].endswith(", 3 messages")
    assert [line.split()[1] for line in lines[2:5]] == ["100"] * 3
    assert all(line.startswith("    offset 100 ") for line in lines[2:5])
    assert "value '00000003" in lines[4] and not lines[5].startswith(" ")
    code, out = run("log", "dump", "--json", str(path))
    records = [json.loads(line) for line in out.splitlines()]
    assert records[1]["compression"] == "zstd" and records[1]["messages"] == 3
    assert [r.get("in_set") for r in records] == [None, None, 100, 100, 100, None]
    assert records[4]["size"] == records[1]["size"] and records[2]["size"] == 0


def test_verify_deep_opens_the_sets_and_finds_damage_inside(tmp_path: Path) -> None:
    write_compressed(tmp_path / "t-0", damaged=True)
    code, out = run("log", "verify", str(tmp_path / "t-0"))
    assert code == 0  # the wrapper's own checksum holds
    said = "3 messages, 1 of them a compressed set (--deep counts what sets hold)"
    assert (
        f"({said}, " in out and out.splitlines()[-1] == f"1 partitions, 1 segments, {said}: all ok"
    )
    code, out = run("log", "verify", "--deep", str(tmp_path / "t-0"))
    assert code == 1
    assert "at byte 100: compressed set: message at byte 200 of the set: cut short" in out
    code, out = run("log", "dump", str(tmp_path / "t-0" / f"{0:020d}.log"))
    assert code == 1 and "compressed set: zstd" in out and ": BAD: compressed set: " in out


def test_verify_deep_counts_the_messages_inside_sets(tmp_path: Path) -> None:
    write_compressed(tmp_path / "t-0", damaged=False)
    code, out = run("log", "verify", "--deep", str(tmp_path / "t-0"))
    assert code == 0 and "(5 messages," in out
    assert out.splitlines()[-1] == "1 partitions, 1 segments, 5 messages: all ok"
    code, out = run("log", "verify", "--json", str(tmp_path / "t-0"))
    records = [json.loads(line) for line in out.splitlines()]
    assert (records[0]["messages"], records[0]["compressed_sets_unopened"]) == (3, 1)
    assert records[-1]["summary"]["compressed_sets_unopened"] == 1
