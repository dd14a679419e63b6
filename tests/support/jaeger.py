"""Jaeger v2 (``github.com/jaegertracing/jaeger`` v1.76.0, ``cmd/jaeger``), built from
the Go module proxy by ``deploy/jaeger/build.sh`` (:mod:`support.jaeger_build`): start a
config of ``deploy/`` on free ports, and read traces back through its query API (port
16686 by default)."""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from support.jaeger_build import jaeger_binary
from support.polling import wait_for
from support.processes import free_port


def otel_attributes(items: list[dict[str, Any]]) -> dict[str, Any]:
    """OTLP/JSON ``attributes`` (as the v3 API returns them) as a plain dict.

    Parameters
    ----------
    items
        ``[{"key": ..., "value": {"stringValue": ...}}, ...]``.

    Returns
    -------
    dict
        Key to value: strings, ints (``intValue`` is a JSON string), floats,
        bools, lists for ``arrayValue``.
    """
    def value(v: dict[str, Any]) -> Any:
        if "intValue" in v:
            return int(v["intValue"])
        if "arrayValue" in v:
            return [value(x) for x in v["arrayValue"].get("values", [])]
        for kind in ("stringValue", "doubleValue", "boolValue"):
            if kind in v:
                return v[kind]
        return None

    return {item["key"]: value(item["value"]) for item in items}


class Jaeger:
    """A running ``jaeger --config CONFIG``, its OTLP receivers, query service and (if
    the config has one) Prometheus exporter moved to free ports with ``--set``.

    Parameters
    ----------
    config
        A Collector/Jaeger YAML file (of ``deploy/``).
    log
        Where its output goes.
    env
        Variables added to its environment (what the config reads with ``${env:...}``).
    prometheus_exporter
        Whether the config has an ``exporters.prometheus`` to move.
    args
        More command-line arguments (``--feature-gates=...``).
    """

    def __init__(self, config: Path, log: Path, env: dict[str, str] | None = None,
                 prometheus_exporter: bool = False, args: tuple[str, ...] = ()):
        self.grpc_port, self.http_port = free_port(), free_port()
        self.query_port, self.query_grpc_port = free_port(), free_port()
        self.metrics_port = free_port() if prometheus_exporter else None
        sets = {
            "receivers.otlp.protocols.grpc.endpoint": f"127.0.0.1:{self.grpc_port}",
            "receivers.otlp.protocols.http.endpoint": f"127.0.0.1:{self.http_port}",
            "extensions.jaeger_query.http.endpoint": f"127.0.0.1:{self.query_port}",
            "extensions.jaeger_query.grpc.endpoint": f"127.0.0.1:{self.query_grpc_port}",
        }
        if self.metrics_port:
            sets["exporters.prometheus.endpoint"] = f"127.0.0.1:{self.metrics_port}"
        self.log = log
        self._command = [jaeger_binary(), f"--config={config}",
                         *(f"--set={key}={value}" for key, value in sets.items()),
                         *args]
        self._env = {**os.environ, **(env or {})}
        self.start()

    def start(self) -> None:
        """Start it (again, after :meth:`stop`: the same ports, empty storage)."""
        self._log_file = open(self.log, "a")
        self.process = subprocess.Popen(self._command, env=self._env,
                                        stdout=self._log_file, stderr=subprocess.STDOUT)
        try:
            wait_for(self._ready, timeout=60, interval=0.2)
        except AssertionError:
            self.stop()
            raise AssertionError(
                f"Jaeger did not start:\n{self.log.read_text()[-3000:]}") from None

    @property
    def otlp_grpc(self) -> str:
        """The OTLP/gRPC endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT`` for ``grpc``)."""
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def otlp_http(self) -> str:
        """The OTLP/HTTP base address (``/v1/traces``, ``/v1/metrics`` below it)."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def query(self) -> str:
        """The query service's base address (UI and HTTP APIs)."""
        return f"http://127.0.0.1:{self.query_port}"

    def _ready(self) -> bool:
        assert self.process.poll() is None, (
            f"Jaeger exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
        return self.get("/api/services") is not None

    def get(self, path: str, **params: str) -> Any | None:
        """GET a query API path as JSON; ``None`` on 404 or no answer (yet)."""
        url = self.query + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                return json.load(reply)
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        except OSError:
            return None

    def trace_v3(self, trace_id: str) -> list[dict[str, Any]]:
        """The spans of a trace from ``/api/v3/traces/{id}`` (OTLP/JSON), flattened:
        each span dict gets ``resource`` and ``attrs`` (plain dicts); [] if none."""
        reply = self.get(f"/api/v3/traces/{trace_id}")
        spans = []
        for rs in (reply or {}).get("result", {}).get("resourceSpans", []):
            resource = otel_attributes(rs.get("resource", {}).get("attributes", []))
            for ss in rs.get("scopeSpans", []):
                for s in ss.get("spans", []):
                    spans.append({**s, "resource": resource,
                                  "attrs": otel_attributes(s.get("attributes", []))})
        return spans

    def trace_v1(self, trace_id: str) -> dict[str, Any] | None:
        """The trace as the UI reads it: ``/api/traces/{id}`` (Jaeger's model: spans
        with ``references``, ``tags``, ``logs``, and ``processes``)."""
        reply = self.get(f"/api/traces/{trace_id}")
        data = (reply or {}).get("data") or []
        return data[0] if data else None

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log_file.close()


def wait_for_spans(jaeger: Jaeger, trace_id: str,
                   predicate: Callable[[list[dict[str, Any]]], Any],
                   timeout: float = 30) -> Any:
    """Poll :meth:`Jaeger.trace_v3` until ``predicate(spans)`` is truthy.

    Parameters
    ----------
    jaeger
        The running Jaeger.
    trace_id
        32 hex digits.
    predicate
        Called with the trace's spans (never with none).
    timeout
        Seconds; then fails, naming the spans Jaeger has of the trace.

    Returns
    -------
    Any
        What ``predicate`` returned.
    """
    def got():
        spans = jaeger.trace_v3(trace_id)
        return predicate(spans) if spans else None

    start = time.monotonic()
    try:
        return wait_for(got, timeout=timeout, interval=0.3)
    except AssertionError:
        names = sorted(s["name"] for s in jaeger.trace_v3(trace_id))
        raise AssertionError(
            f"trace {trace_id} not as expected in Jaeger after "
            f"{time.monotonic() - start:.0f}s; its spans: {names}") from None


# A workflow's pieces: task code and the client's exporter

CLIENT_SERVICE = "test-client"
BAD_RECORD = 3


def traced_task(x: int) -> int:
    """Task code that makes a span of its own (the worker's global tracer)."""
    from opentelemetry import trace

    with trace.get_tracer("task code").start_as_current_span("in task") as own:
        own.set_attribute("record", x)
        time.sleep(0.05)
    return x


def inner_span_through_worker_client(n: int) -> int:
    """Task code as a Dask user writes it (docs/data-contract.md, "Identifiers"): a
    plain ``distributed.span`` opened in a task, ``n`` more :func:`traced_task`
    computed in it through ``worker_client``."""
    import dask
    import distributed

    with distributed.worker_client() as client, distributed.span("inner"):
        return sum(client.compute([dask.delayed(traced_task)(i) for i in range(n)],
                                  sync=True))


def check(x: int) -> int:
    """Task code with a span of its own; record 3 raises inside it."""
    from opentelemetry import trace

    with trace.get_tracer("task code").start_as_current_span("check record"):
        if x == BAD_RECORD:
            raise ValueError(f"record {x}: negative amount")
    return x


def client_tracer(jaeger: Jaeger) -> TracerProvider:
    """A client-side provider exporting over OTLP/HTTP into ``jaeger`` (not the global
    one: the test process stays as it was)."""
    provider = TracerProvider(resource=Resource.create({"service.name": CLIENT_SERVICE}))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{jaeger.otlp_http}/v1/traces")))
    return provider


def export_env(jaeger: Jaeger) -> dict[str, str]:
    """Traces over OTLP/gRPC, metrics over OTLP/HTTP, both into ``jaeger``."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": jaeger.otlp_grpc,
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": f"{jaeger.otlp_http}/v1/metrics",
    }
