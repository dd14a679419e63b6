"""Debian's ``prometheus`` and ``promtool``."""
from __future__ import annotations

import shutil
import subprocess
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
