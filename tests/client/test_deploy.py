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
