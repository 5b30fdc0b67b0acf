"""The report of an audit (pipeline.audit): what it found, hour by hour (`HourCount`, and
`Where` a stage's content first differs), as the table it prints (`format_table`, and
`format_stages` across clusters) and as the JSON lines of `--json` (`hour_fields`,
`mirror_totals`). Plain Python: no Spark here.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

STAGES: Final = {
    "source": "producers -> source",
    "mirror": "source -> mirror target",
    "load": "mirror target -> Parquet",
}
"""The stages a message passes, as the report names them."""


@dataclass(frozen=True, slots=True)
class Where:
    """Where a stage's content first differs in an hour: the lowest partition with a
    difference, the first offset there whose message differs (missing, extra or changed on
    one side), and how many (partition, offset) places differ in all."""

    partition: int
    offset: int
    places: int


@dataclass(frozen=True, slots=True)
class HourCount:
    """Messages of one hour (starting at `hour`, UTC) in pylog and in Parquet, what the
    producers said they produced (None when no audit topic was read) and what the mirror's
    target holds (None when no mirror was named). `digests`: the sum of the messages'
    digests (broker.client.audit.message_digest) on each side counted ("produced",
    "in_pylog", "mirrored", "loaded"; None for producers' records without one); `where`: for
    a stage whose content differs with equal counts, where it first does (None when the side
    before it is the producers', who say no offsets)."""

    hour: datetime.datetime
    in_pylog: int
    loaded: int
    produced: int | None = None
    mirrored: int | None = None
    digests: Mapping[str, int | None] = field(default_factory=dict)
    where: Mapping[str, Where | None] = field(default_factory=dict)

    @property
    def difference(self) -> int:
        """Loaded minus what the load read: the mirror's target when there is one."""
        return self.loaded - (self.in_pylog if self.mirrored is None else self.mirrored)

    @property
    def lost(self) -> dict[str, int]:
        """Stage -> the messages it lost (negative: it has more than it was given), for the
        stages counted."""
        lost = {} if self.produced is None else {"source": self.produced - self.in_pylog}
        if self.mirrored is not None:
            lost["mirror"] = self.in_pylog - self.mirrored
        return {**lost, "load": -self.difference}

    @property
    def changed(self) -> list[str]:
        """The stages that hold as many messages of the hour as they were given, but not the
        same ones (a message changed, replaced, moved, or one lost and another added)."""
        sides = {
            "source": ("produced", "in_pylog"),
            "mirror": ("in_pylog", "mirrored"),
            "load": ("in_pylog" if self.mirrored is None else "mirrored", "loaded"),
        }
        lost = self.lost
        return [
            stage
            for stage, (before, after) in sides.items()
            if lost.get(stage) == 0
            and None not in (self.digests.get(before), self.digests.get(after))
            and self.digests[before] != self.digests[after]
        ]

    @property
    def differs(self) -> bool:
        return any(self.lost.values()) or bool(self.changed)


def format_table(topic: str, counts: list[HourCount], with_produced: bool = False) -> str:
    """The audit's table: one line per hour, a total, and OK or the differences; the
    producers' counts in a first column `with_produced`."""
    produced_head = f" {'produced':>12}" if with_produced else ""
    lines = [
        f"{'hour (UTC)':<17}{produced_head} {'in pylog':>12} {'loaded':>12} {'difference':>12}"
    ]
    for count in counts:
        mark = _mark(count)
        produced = f" {count.produced:>12}" if with_produced else ""
        lines.append(
            f"{count.hour:%Y-%m-%d %H:00} {produced} {count.in_pylog:>12} {count.loaded:>12} "
            f"{count.difference:>+12}{mark}"
        )
    total_pylog = sum(c.in_pylog for c in counts)
    total_loaded = sum(c.loaded for c in counts)
    total_produced = f" {sum(c.produced or 0 for c in counts):>12}" if with_produced else ""
    lines.append(
        f"{'total':<17}{total_produced} {total_pylog:>12} {total_loaded:>12} "
        f"{total_loaded - total_pylog:>+12}"
    )
    differing = sum(1 for c in counts if c.differs)
    lines.append(
        f"{topic}: OK, every hour matches"
        if not differing
        else f"{topic}: {differing} hour(s) differ" + _changed_verdict(counts, "; ")
    )
    return "\n".join(lines)


def _mark(count: HourCount) -> str:
    """The end of an hour's line: nothing, or that it differs and where content changed."""
    if not count.differs:
        return ""
    changed = "; ".join(_changed_text(count, stage) for stage in count.changed)
    return "  <-- differs" + (f": {changed}" if changed else "")


def _changed_text(count: HourCount, stage: str) -> str:
    where = count.where.get(stage)
    if where is None:
        return f"{stage} content changed"
    more = f" (+{where.places - 1} more)" if where.places > 1 else ""
    return f"{stage} content changed at partition {where.partition} offset {where.offset}{more}"


def _changed_verdict(counts: list[HourCount], lead: str) -> str:
    """What each stage changed (counts equal, content not), over the hours, or ""."""
    said = []
    for stage in STAGES:
        hours = sum(1 for count in counts if stage in count.changed)
        if hours:
            said.append(f"the {stage} ({STAGES[stage]}) changed content in {hours} hour(s)")
    return lead + "; ".join(said) if said else ""


def format_stages(topic: str, counts: list[HourCount], with_produced: bool = False) -> str:
    """The audit's table across clusters: per hour, each stage's count and what each stage
    lost (or added), a total, and OK or the losses of each stage."""
    heads = [*(["produced"] if with_produced else []), "in source", "mirrored", "loaded"]
    lines = [f"{'hour (UTC)':<17}" + "".join(f" {head:>12}" for head in heads) + "  lost at"]
    for count in counts:
        lines.append(
            f"{count.hour:%Y-%m-%d %H:00} " + _stage_cells(count, with_produced) + _mark(count)
        )
    total = HourCount(
        counts[0].hour if counts else datetime.datetime.now(datetime.UTC),
        sum(c.in_pylog for c in counts),
        sum(c.loaded for c in counts),
        sum(c.produced or 0 for c in counts) if with_produced else None,
        sum(c.mirrored or 0 for c in counts),
    )
    lines.append(f"{'total':<17}" + _stage_cells(total, with_produced))
    differing = sum(1 for c in counts if c.differs)
    if not differing:
        lines.append(f"{topic}: OK, every stage holds every message of every hour")
    else:
        losses = [f"the {stage} ({STAGES[stage]}) {said}" for stage, said in _losses(counts)]
        changed = _changed_verdict(counts, "; " if losses else "")
        lines.append(f"{topic}: {differing} hour(s) differ: " + "; ".join(losses) + changed)
    return "\n".join(lines)


def _losses(counts: list[HourCount]) -> list[tuple[str, str]]:
    """(stage, what it lost and what it added over the hours) for each stage that did: one
    hour's loss and another hour's extra messages are both said, not netted out."""
    losses = []
    for stage in STAGES:
        per_hour = [count.lost.get(stage, 0) for count in counts]
        lost, extra = sum(n for n in per_hour if n > 0), sum(n for n in per_hour if n < 0)
        said = [_lost_text(n) for n in (lost, extra) if n]
        if said:
            losses.append((stage, " and ".join(said)))
    return losses


def _stage_cells(count: HourCount, with_produced: bool) -> str:
    values = [*([count.produced] if with_produced else []), count.in_pylog, count.mirrored]
    cells = "".join(f" {value:>12}" for value in [*values, count.loaded])
    lost = ", ".join(f"{stage} {_lost_text(n)}" for stage, n in count.lost.items() if n)
    return f"{cells}  {lost}".rstrip()


def _lost_text(count: int) -> str:
    return f"{count} lost" if count > 0 else f"{-count} extra"


def hour_fields(count: HourCount, with_produced: bool) -> dict[str, object]:
    mirrored = count.mirrored is not None
    return {
        "hour": count.hour.isoformat(),
        **({"produced": count.produced} if with_produced else {}),
        "in_pylog": count.in_pylog,
        **({"mirrored": count.mirrored, "lost": count.lost} if mirrored else {}),
        "loaded": count.loaded,
        "difference": count.difference,
        **(
            {"changed": {stage: _where_json(count, stage) for stage in count.changed}}
            if count.changed
            else {}
        ),
    }


def _where_json(count: HourCount, stage: str) -> dict[str, int] | None:
    where = count.where.get(stage)
    return None if where is None else dataclasses.asdict(where)


def mirror_totals(counts: list[HourCount]) -> dict[str, object]:
    lost: dict[str, int] = {}
    for count in counts:
        for stage, n in count.lost.items():
            lost[stage] = lost.get(stage, 0) + n
    return {"mirrored": sum(c.mirrored or 0 for c in counts), "lost": lost}
