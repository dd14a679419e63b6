"""Real processes: ``dask scheduler --preload dask_otel_spans`` and ``dask worker``."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from support.polling import wait_for
from support.receivers import OTLPReceiver

#: The tests' export processes at the scheduler's priority: the default, SCHED_IDLE,
#: waits while every core is busy, as the parallel suite keeps them (spans exported
#: tens of seconds late; its own test sets it). For the environment of the tests' real
#: schedulers, examples and demo (:data:`support.plugin.FAST` for in-process ones)
TEST_CPU_POLICY = {"DASK_OTEL_SPANS__EXPORT_PROCESS_CPU_POLICY": "normal"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DaskProcesses:
    """``dask scheduler --preload dask_otel_spans`` and ``dask worker`` subprocesses
    (``worker_preload``: ``dask worker --preload dask_otel_spans``;
    ``scheduler_preload=False``: ``dask scheduler`` without it; ``launcher``: each
    command started by it, e.g. ``[opentelemetry-instrument]``; ``worker_logs``: a
    directory each worker writes its output to, ``worker-<i>.log``, else nowhere).

    Ready once the scheduler listens. The workers start beside it and read its
    address from its scheduler file (written once it listens), as the tests' clients
    connect once it is ready: a worker or client that finds no scheduler yet retries
    with a growing random backoff (distributed's connect), which added up to seconds
    per cluster on a busy machine."""

    def __init__(self, env: dict[str, str], cwd: str, workers: int = 1,
                 dashboard: bool = False, nanny: bool = False,
                 worker_preload: bool = False, scheduler_preload: bool = True,
                 launcher: tuple[str, ...] = (), worker_logs: str | None = None):
        # (ports the scheduler picks, read from its scheduler file: a free port
        # picked here could be taken by another process before it listened)
        self.port = 0
        self.address = ""
        self.dashboard_port: int | None = None
        self.env = {
            **os.environ,
            "OTEL_METRIC_EXPORT_INTERVAL": "300",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "DASK_OTEL_SPANS__EXPORT_DELAY": "0.2s",
            **TEST_CPU_POLICY,
            "PYTHONPATH": os.pathsep.join(sys.path),
            **env,
        }
        dash = (["--dashboard-address", "127.0.0.1:0"]
                if dashboard else ["--no-dashboard"])
        dask_cli = [*launcher, sys.executable, "-m", "dask"]
        # (written by the scheduler once it listens; outside cwd, which tests list)
        self.scheduler_file = os.path.join(tempfile.mkdtemp(prefix="dask-processes-"),
                                           "scheduler.json")
        self.scheduler = subprocess.Popen(
            [*dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--scheduler-file", self.scheduler_file,
             *dash, *(["--preload", "dask_otel_spans"] if scheduler_preload else [])],
            env=self.env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        self._worker_logs = [
            open(os.path.join(worker_logs, f"worker-{i}.log"), "w") if worker_logs
            else subprocess.DEVNULL for i in range(workers)]
        self.workers = [
            subprocess.Popen(
                [*dask_cli, "worker", "--scheduler-file", self.scheduler_file,
                 "--nthreads", "2", "--no-dashboard", "--nanny" if nanny else "--no-nanny",
                 *(["--preload", "dask_otel_spans"] if worker_preload else [])],
                env=self.env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
            )
            for log in self._worker_logs
        ]
        try:
            identity = wait_for(lambda: self._identity()
                                or self.scheduler.poll() is not None, timeout=60)
        except AssertionError:
            raise AssertionError(f"the scheduler did not start:\n{self.stop()}") from None
        if self.scheduler.poll() is not None:
            raise AssertionError(f"the scheduler exited:\n{self.stop()}")
        self.address = identity["address"]
        self.port = int(self.address.rsplit(":", 1)[1])
        if dashboard:
            self.dashboard_port = int(identity["services"]["dashboard"])

    def _identity(self) -> dict | None:
        """The scheduler's identity in its scheduler file, once it is whole."""
        try:
            with open(self.scheduler_file) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def stop(self) -> str:
        """Stop everything (SIGTERM: a graceful scheduler close); the scheduler's log.

        The workers first, then the scheduler: a worker told to stop while its
        scheduler closes may wait for it to come back (outliving SIGTERM by the 30 s
        wait below in about one stop in three on a busy machine)."""
        for group in (self.workers, [self.scheduler]):
            for p in group:
                if p.poll() is None:
                    p.terminate()
            for p in group:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for log in self._worker_logs:
            if log != subprocess.DEVNULL:
                log.close()
        shutil.rmtree(os.path.dirname(self.scheduler_file), ignore_errors=True)
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
