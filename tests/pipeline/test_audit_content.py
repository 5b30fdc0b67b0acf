"""The audit by content (issue 51): besides each hour's count, the sum of its messages'
digests at each stage (what producers acknowledged, what the source and the mirror's target
store, what was loaded into Parquet), so that a message changed, or one lost and another
duplicated in the same hour, is caught although the counts agree, and named by stage,
partition and offset."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from broker.client import PartitionConsumer, Producer
from broker.log.message import encode_message
from pipeline import audit, load
from tests.mirror.conftest import MirrorProcess
from tests.pipeline.conftest import create_topic
from tests.pipeline.test_audit_clusters import AUDIT_TOPIC, TOPIC, mirrored
from tests.pylogd import RunningBroker

pytestmark = pytest.mark.slow  # ~45 s: Spark loads audited by content, one across a mirror

TEN = datetime.datetime(2026, 11, 22, 10, 5, tzinfo=datetime.UTC)
WINDOW = ("--start", "2026-11-22T10:00", "--end", "2026-11-22T11:00")


def ms(moment: datetime.datetime) -> int:
    return int(moment.timestamp() * 1000)


def produce_audited(endpoint: str, topic: str, audit_topic: str, count: int) -> None:
    with Producer(endpoint, topic, audit_topic=audit_topic) as producer:
        for n in range(count):
            producer.send(b"visit %03d" % n, b"user-%d" % (n % 3), ms(TEN) + n, n % 2)


def offsets_of(endpoint: str, topic: str, partition: int) -> list[int]:
    with PartitionConsumer(endpoint, topic, partition, stop_at_end=True) as reader:
        return [m.offset for m in reader]


def hour_files(output: str, topic: str) -> dict[Path, pa.Table]:
    """The load's Parquet files of hour 10, with what each holds."""
    paths = Path(output).glob(f"topic={topic}/date=2026-11-22/hour=10/*.parquet")
    return {path: pq.read_table(path) for path in paths}


def write(path: Path, table: pa.Table) -> None:
    """Write a Parquet file of a load as pyarrow (not Hadoop's file system) does: without the
    checksum file Hadoop keeps beside it, which would no longer match; timestamps as Spark
    wrote them (INT96)."""
    pq.write_table(table, path, use_deprecated_int96_timestamps=True)
    path.with_name(f".{path.name}.crc").unlink(missing_ok=True)


def rewrite(
    files: dict[Path, pa.Table], edit: Callable[[list[dict[str, object]]], list[dict[str, object]]]
) -> None:
    """Rewrite a load's Parquet files, each one's rows through `edit`."""
    for path, table in files.items():
        write(path, pa.Table.from_pylist(edit(table.to_pylist()), schema=table.schema))


def restore(files: dict[Path, pa.Table]) -> None:
    for path, table in files.items():
        write(path, table)


def test_the_audit_names_a_parquet_row_edited_and_a_row_lost_with_another_duplicated(
    spark: SparkSession, broker: RunningBroker, topic: str, tmp_path: Path
) -> None:
    audit_topic = f"{topic}-audit"
    create_topic(broker.endpoint, topic, 2)
    create_topic(broker.endpoint, audit_topic, 1)
    produce_audited(broker.endpoint, topic, audit_topic, 20)
    output = str(tmp_path / "warehouse")
    load.load(spark, {"broker": broker.endpoint}, [topic], output)
    arguments = [
        *("--broker", broker.endpoint, "--topic", topic, "--output", output),
        *("--audit-topic", audit_topic, *WINDOW),
    ]
    runner = CliRunner()
    assert runner.invoke(audit.main, arguments).exit_code == 0  # digests agree everywhere
    original = hour_files(output, topic)
    seventh = offsets_of(broker.endpoint, topic, 1)[3]  # partition 1's fourth message

    def edited(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        for row in rows:
            if (row["partition"], row["offset"]) == (1, seventh):
                row["value"] = b"visit 999"  # as long as before
        return rows

    rewrite(original, edited)
    report = runner.invoke(audit.main, arguments)
    assert report.exit_code == 1, report.output
    assert report.output.splitlines() == [
        "hour (UTC)            produced     in pylog       loaded   difference",
        "2026-11-22 10:00            20           20           20           +0  <-- differs: "
        f"load content changed at partition 1 offset {seventh}",
        "total                       20           20           20           +0",
        f"{topic}: 1 hour(s) differ; the load (mirror target -> Parquet) changed content in "
        "1 hour(s)",
    ]
    as_json = [
        json.loads(line)
        for line in runner.invoke(audit.main, [*arguments, "--json"]).stdout.splitlines()
    ]
    assert as_json[0]["changed"] == {"load": {"partition": 1, "offset": seventh, "places": 1}}
    assert as_json[-1]["differing_hours"] == 1

    # One row lost and another duplicated: the counts agree, the content does not
    restore(original)
    starts = offsets_of(broker.endpoint, topic, 0)

    def swapped(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        kept = [row for row in rows if (row["partition"], row["offset"]) != (0, starts[2])]
        return kept + [r for r in rows if (r["partition"], r["offset"]) == (0, starts[7])]

    rewrite(original, swapped)
    report = runner.invoke(audit.main, arguments)
    assert report.exit_code == 1, report.output
    assert report.output.splitlines()[1].endswith(
        f"+0  <-- differs: load content changed at partition 0 offset {starts[2]} (+1 more)"
    )

    restore(original)
    assert runner.invoke(audit.main, arguments).exit_code == 0


def change_on_disk(broker: RunningBroker, topic: str, partition: int, offset: int) -> bytes:
    """Change the value of the message at `offset` in the broker's segment file to another of
    its length, checksum and all, as a bug or a hand might: what the broker serves from then
    on. Returns the new value."""
    (folder,) = [f for f in broker.data_dir.rglob(f"{topic}-{partition}") if f.is_dir()]
    segment = max(
        (s for s in folder.glob("*.log") if int(s.stem) <= offset), key=lambda s: int(s.stem)
    )
    with segment.open("r+b") as file:
        file.seek(offset - int(segment.stem))
        head = file.read(26)
        length = int.from_bytes(head[:4], "big")
        rest = file.read(length - 22)
        key_length = int.from_bytes(head[22:26], "big", signed=True)
        key = None if key_length < 0 else rest[:key_length]
        value = rest[max(key_length, 0) :]
        changed = value.upper() if value != value.upper() else value.lower()
        timestamp = int.from_bytes(head[14:22], "big", signed=True)
        encoded = encode_message(changed, key, timestamp)
        assert len(encoded) == 4 + length
        file.seek(offset - int(segment.stem))
        file.write(encoded)
    return changed


def test_a_value_changed_on_disk_at_the_mirrors_target_is_named_at_the_mirror_stage(
    spark: SparkSession,
    clusters: tuple[RunningBroker, RunningBroker],
    make_mirror: Callable[..., MirrorProcess],
    tmp_path: Path,
) -> None:
    source, target = clusters
    create_topic(source.endpoint, TOPIC, 2)
    create_topic(source.endpoint, AUDIT_TOPIC, 1)
    produce_audited(source.endpoint, TOPIC, AUDIT_TOPIC, 30)
    mirrored(make_mirror, source.endpoint, target.endpoint, 2)
    at = offsets_of(target.endpoint, TOPIC, 0)[5]
    new_value = change_on_disk(target, TOPIC, 0, at)
    with PartitionConsumer(target.endpoint, TOPIC, 0, start=at, stop_at_end=True) as reader:
        assert next(iter(reader)).value == new_value  # served as it now is: checksums hold
    output = str(tmp_path / "warehouse")
    load.load(spark, {"broker": target.endpoint}, [TOPIC], output)  # the load agrees with it

    arguments = [
        *("--broker", source.endpoint, "--topic", TOPIC, "--output", output),
        *("--audit-topic", AUDIT_TOPIC, "--mirror-broker", target.endpoint, *WINDOW),
    ]
    report = CliRunner().invoke(audit.main, arguments)
    assert report.exit_code == 1, report.output
    assert report.output.splitlines() == [
        "hour (UTC)            produced    in source     mirrored       loaded  lost at",
        "2026-11-22 10:00            30           30           30           30  <-- differs: "
        f"mirror content changed at partition 0 offset {at}",
        "total                       30           30           30           30",
        f"{TOPIC}: 1 hour(s) differ: the mirror (source -> mirror target) changed content in "
        "1 hour(s)",
    ]
