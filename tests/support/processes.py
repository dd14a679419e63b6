"""Real processes: ``dask scheduler --preload dask_otel_spans`` and ``dask worker``."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from support.receivers import OTLPReceiver


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DaskProcesses:
    """``dask scheduler --preload dask_otel_spans`` and ``dask worker`` subprocesses
    (``worker_preload``: ``dask worker --preload dask_otel_spans``;
    ``scheduler_preload=False``: ``dask scheduler`` without it; ``launcher``: each
    command started by it, e.g. ``[opentelemetry-instrument]``)."""

    def __init__(self, env: dict[str, str], cwd: str, workers: int = 1,
                 dashboard: bool = False, nanny: bool = False,
                 worker_preload: bool = False, scheduler_preload: bool = True,
                 launcher: tuple[str, ...] = ()):
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.dashboard_port = free_port() if dashboard else None
        self.env = {
            **os.environ,
            "OTEL_METRIC_EXPORT_INTERVAL": "300",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "DASK_OTEL_SPANS__EXPORT_DELAY": "0.2s",
            "PYTHONPATH": os.pathsep.join(sys.path),
            **env,
        }
        dash = (["--dashboard-address", f"127.0.0.1:{self.dashboard_port}"]
                if dashboard else ["--no-dashboard"])
        dask_cli = [*launcher, sys.executable, "-m", "dask"]
        self.scheduler = subprocess.Popen(
            [*dask_cli, "scheduler", "--host", "127.0.0.1", "--port", str(self.port),
             *dash, *(["--preload", "dask_otel_spans"] if scheduler_preload else [])],
            env=self.env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        self.workers = [
            subprocess.Popen(
                [*dask_cli, "worker", self.address, "--nthreads",
                 "2", "--no-dashboard", "--nanny" if nanny else "--no-nanny",
                 *(["--preload", "dask_otel_spans"] if worker_preload else [])],
                env=self.env, cwd=cwd, stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
            for _ in range(workers)
        ]

    def stop(self) -> str:
        """Stop everything (SIGTERM: a graceful scheduler close); the scheduler's log."""
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                p.terminate()
        for p in [*self.workers, self.scheduler]:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        return self.scheduler.stdout.read() if self.scheduler.stdout else ""


def otlp_grpc_env(receiver: OTLPReceiver) -> dict[str, str]:
    """``OTEL_*`` variables that send traces and metrics to ``receiver``."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }


def opentelemetry_instrument() -> str:
    """The ``opentelemetry-instrument`` launcher of this environment (opentelemetry-
    distro, in the test extra)."""
    path = Path(sys.executable).parent / "opentelemetry-instrument"
    found = str(path) if path.exists() else shutil.which("opentelemetry-instrument")
    if found is None:
        raise AssertionError("no opentelemetry-instrument: pip install -e '.[test]'")
    return found
