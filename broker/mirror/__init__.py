"""Mirroring between clusters (docs/mirror.md): `pylog-mirror` copies topics of a source cluster
to a target cluster, each partition's bytes in order into the same partition of a topic only
it writes, so that every message has the same offset on both clusters.

    MirrorConfig    the TOML file's settings, checked (config.py)
    Mirror          discovers the source's topics, prepares them on the target, runs a copy
                    per partition (mirror.py)
    PartitionCopy   one partition's copy loop, its CopyProgress, Diverged (copy.py)
    MirrorCollector its figures for Prometheus (metrics.py)
"""

from broker.mirror.config import MirrorConfig, MirrorConfigError, MirrorSettings
from broker.mirror.copy import CopyProgress, Diverged, PartitionCopy
from broker.mirror.metrics import MirrorCollector
from broker.mirror.mirror import Mirror

__all__ = [
    "CopyProgress",
    "Diverged",
    "Mirror",
    "MirrorCollector",
    "MirrorConfig",
    "MirrorConfigError",
    "MirrorSettings",
    "PartitionCopy",
]
