"""deploy/: every YAML and JSON file parses, and promtool accepts the Prometheus
configuration (the dashboards' metrics in a real scrape:
processes/test_prometheus.py)."""
from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from support.paths import DEPLOY
from support.prometheus import prometheus_binary


@pytest.mark.cluster  # (promtool)
def test_promtool_accepts_the_prometheus_config():
    proc = subprocess.run(
        [prometheus_binary("promtool"), "check", "config",
         str(DEPLOY / "compose" / "prometheus.yml")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_deploy_yaml_and_json_parses():
    files = [p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml", ".json")]
    assert len(files) >= 10
    for path in files:
        text = path.read_text()
        if path.suffix == ".json":
            json.loads(text)
        else:
            assert list(yaml.safe_load_all(text)), path


def test_the_operator_manifest_instruments_scheduler_and_workers_without_a_preload():
    """Zero-code on Kubernetes: an ``Instrumentation`` carrying trace context and
    baggage, and both DaskCluster pod templates annotated for its Python injection,
    with the package in the image and no ``--preload``."""
    docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "otel-operator.yaml")
                                   .read_text()))
    by_kind = {doc["kind"]: doc for doc in docs}
    instrumentation, cluster = by_kind["Instrumentation"], by_kind["DaskCluster"]
    assert {"tracecontext", "baggage"} <= set(instrumentation["spec"]["propagators"])
    python_env = {e["name"]: e["value"] for e in instrumentation["spec"]["python"]["env"]}
    assert python_env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"
    assert python_env["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith(":4318")
    name = instrumentation["metadata"]["name"]
    for side in ("scheduler", "worker"):
        pod = cluster["spec"][side]
        assert pod["metadata"]["annotations"] == {
            "instrumentation.opentelemetry.io/inject-python": name}
        (container,) = pod["spec"]["containers"]
        assert "--preload" not in container["args"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert "dask_otel_spans" in env["EXTRA_PIP_PACKAGES"].split()
