"""Reading a /metrics scrape and the Grafana dashboard's queries (deploy/grafana/prismserve.json)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "prismserve.json"


def dashboard_metrics() -> set[str]:
    """The metric names the Grafana dashboard's queries read."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel.get("targets", [])]
    return {name for expr in exprs for name in re.findall(r"\b(?:prismserve|vllm)[a-zA-Z0-9_:]*", expr)}


_SERIES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported(text: str) -> dict[str, list]:
    """The series of a scrape by name (`_total`, `_bucket`, `_count` as Prometheus writes them),
    each with its samples (none yet for a labelled series nothing was counted in)."""
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for suffix in _SERIES.get(family.type, ("",)):
            samples.setdefault(family.name + suffix, [])
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples
