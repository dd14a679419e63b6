"""Debian's ``prometheus`` and ``promtool``."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path


def prometheus_binary(name: str) -> str:
    path = shutil.which(name) or f"/usr/bin/{name}"
    assert Path(path).exists(), f"{name} not installed (apt-get install -y prometheus)"
    return path


def promtool_check_metrics(text: str) -> subprocess.CompletedProcess:
    """``promtool check metrics`` on a scrape's text."""
    return subprocess.run(
        [prometheus_binary("promtool"), "check", "metrics"], input=text,
        capture_output=True, text=True, timeout=60,
    )


def promql(base: str, query: str) -> list[dict]:
    """A PromQL instant query through Prometheus's HTTP API (``base``: its URL); its
    result, [] while Prometheus does not answer yet."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    try:
        reply = json.load(urllib.request.urlopen(url, timeout=5))
    except OSError:
        return []
    assert reply["status"] == "success", reply
    return reply["data"]["result"]


def query_exemplars(base: str, query: str, seconds: float = 600) -> list[dict]:
    """``/api/v1/query_exemplars`` over the last ``seconds``: per series,
    ``seriesLabels`` and ``exemplars`` (each with ``labels``, ``value``); [] while
    Prometheus does not answer yet."""
    now = time.time()
    url = f"{base}/api/v1/query_exemplars?" + urllib.parse.urlencode(
        {"query": query, "start": f"{now - seconds:.3f}", "end": f"{now + 60:.3f}"})
    try:
        reply = json.load(urllib.request.urlopen(url, timeout=5))
    except OSError:
        return []
    assert reply["status"] == "success", reply
    return reply["data"] or []
