"""The metrics the example Grafana dashboard (deploy/grafana/pylog.json) and the example alerting
rules (deploy/prometheus/pylog-alerts.yml) query: every one must be served by a broker
(tests/broker/test_metrics.py), the Curve ones by a Curve broker (tests/security/test_security.py),
the quota ones by a broker once a client with a quota sent (tests/broker/test_quota_enforcement.py),
the retention guard's once a group has committed offsets (tests/client/test_retention.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Final

DASHBOARD: Final = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "pylog.json"
CURVE_ONLY: Final = frozenset(
    {
        "pylog_connections_accepted_total",
        "pylog_connections_refused_total",
        "pylog_handshakes_failed_total",
        "pylog_authorization_failures_total",
    }
)
"""Served by a broker in security.mode curve only (broker/metrics.py)."""
QUOTA_ONLY: Final = frozenset(
    {
        "pylog_quota_bytes_total",
        "pylog_quota_throttle_seconds_total",
        "pylog_quota_bytes_per_second",
    }
)
"""Served once a client with a quota has sent (broker/metrics.py;
tests/broker/test_quota_enforcement.py)."""
RETENTION_ONLY: Final = frozenset({"pylog_group_retention_seconds"})
"""Served once a group has committed offsets for the retention guard to forecast
(broker/groups/guard.py; tests/client/test_retention.py)."""
ALERTS: Final = DASHBOARD.parents[1] / "prometheus" / "pylog-alerts.yml"


def queried_metrics() -> set[str]:
    """The metric names the dashboard's panels query."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\b((?:pylog|process)_\w+)", target["expr"])
    }


def alerted_metrics() -> set[str]:
    """The metric names the example alerting rules' expressions query."""
    expressions = re.findall(r"^\s*expr:\s*(.+)$", ALERTS.read_text(), re.MULTILINE)
    return {name for expr in expressions for name in re.findall(r"\b(pylog_\w+)", expr)}
