"""The dashboard and alert rules of docs/operations.md name only metrics a worker exports, and the
copies in the page are the files' (docs/grafana-dashboard.json, docs/prometheus-alerts.yml)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from workers.observe.metrics import Metrics

DOCS = Path(__file__).resolve().parents[2] / "docs"
NAME = re.compile(r"\btoolloop_[a-z_]+")


SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count", "_sum"),
    "gauge": ("",),
}


def exported() -> set[str]:
    """Every sample name a worker's /metrics can show (labelled series appear once used)."""
    metrics = Metrics(lambda: {"llm": 0}, lambda: 0, lambda: {"llm": 0.0})
    return {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in SUFFIXES[family.type]
    }


def block(language: str) -> str:
    text = (DOCS / "operations.md").read_text()
    found = re.search(rf"```{language}\n(.*?)```", text, re.S)
    assert found is not None, f"no ```{language} block in docs/operations.md"
    return found.group(1)


def test_the_dashboard_is_valid_json_over_exported_metrics() -> None:
    known = exported()
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [
        target["expr"] for panel in dashboard["panels"] for target in panel["targets"]
    ]
    assert len(dashboard["panels"]) >= 10
    names = {name for expr in exprs for name in NAME.findall(expr)}
    assert names, exprs
    assert names <= known, names - known
    assert json.loads(block("json")) == dashboard


def test_the_three_alerts_name_exported_metrics() -> None:
    rules = yaml.safe_load((DOCS / "prometheus-alerts.yml").read_text())
    alerts = {
        rule["alert"]: rule for group in rules["groups"] for rule in group["rules"]
    }
    assert set(alerts) == {
        "ToolloopCacheReadRatioDrop",
        "ToolloopRerunRate",
        "ToolloopQueueDepth",
    }
    names = {name for rule in alerts.values() for name in NAME.findall(rule["expr"])}
    assert names <= exported(), names - exported()
    assert yaml.safe_load(block("yaml")) == rules


def test_the_keda_recipe_is_a_scaled_object_over_exported_metrics_and_the_llm_queue() -> (
    None
):
    text = (DOCS / "operations.md").read_text()
    recipe = next(
        yaml.safe_load(found)
        for found in re.findall(r"```yaml\n(.*?)```", text, re.S)
        if "ScaledObject" in found
    )
    assert recipe["kind"] == "ScaledObject" and recipe["spec"]["minReplicaCount"] == 0
    triggers = recipe["spec"]["triggers"]
    assert [t["metadata"]["listName"] for t in triggers if t["type"] == "redis"] == [
        "llm"
    ]
    queries = [t["metadata"]["query"] for t in triggers if t["type"] == "prometheus"]
    names = [set(NAME.findall(query)) for query in queries]
    assert names == [
        {"toolloop_queue_depth", "toolloop_steps_in_flight"},
        {"toolloop_queue_oldest_seconds"},
    ]
    assert set().union(*names) <= exported(), set().union(*names) - exported()
    assert [t.get("metricType") for t in triggers if t["type"] == "prometheus"] == [
        None,
        "Value",
    ]
