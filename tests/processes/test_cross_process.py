"""Real processes: ``dask scheduler --preload dask_otel_spans`` and ``dask worker``,
exporting over OTLP/gRPC to a receiver built from ``opentelemetry-proto``."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from distributed import Client
from opentelemetry.sdk.trace import TracerProvider
from support.heartbeats import holds_all, worker_span_metrics
from support.polling import wait_for
from support.processes import DaskProcesses, otlp_grpc_env

from dask_otel_spans import names, span
from dask_otel_spans.protocol.propagation import otel_span_id, prefix_span_id


def sleepy(x: float) -> float:
    time.sleep(x)
    return x


@pytest.fixture(scope="module")
def otlp_receiver(module_otlp_receiver):
    return module_otlp_receiver


@pytest.fixture(scope="module")
def cluster(otlp_receiver, tmp_path_factory):
    """Started once for the module: each test names its own spans."""
    procs = DaskProcesses(
        {**otlp_grpc_env(otlp_receiver), "OTEL_SERVICE_NAME": "test-scheduler"},
        cwd=str(tmp_path_factory.mktemp("cluster")),
    )
    try:
        yield procs.address, procs.scheduler
    finally:
        procs.stop()


def worker_clock_offset(dask_worker) -> float:
    """Seconds a worker adds to its task times (its scheduler clock estimate)."""
    return dask_worker.scheduler_delay


def test_trace_and_metrics_over_otlp_grpc_from_real_processes(cluster, otlp_receiver):
    address, scheduler_proc = cluster
    tracer = TracerProvider().get_tracer("client-app")
    with Client(address, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        delays = [client.run(worker_clock_offset)]
        t_enter = time.time_ns()
        with tracer.start_as_current_span("client request") as request:
            with span("etl") as etl_id:
                with span("load") as load_id:
                    client.gather(client.map(sleepy, [0.1] * 6, pure=False))
                    with tracer.start_as_current_span("http call") as http:
                        pass
        t_exit = time.time_ns()
        delays.append(client.run(worker_clock_offset))

        def dask_spans():
            spans = {s["name"]: s for s in otlp_receiver.spans()}
            return spans if {"etl", "load", "sleepy"} <= set(spans) else None

        spans = wait_for(dask_spans, timeout=30)
        ctx = request.get_span_context()
        trace_hex = f"{ctx.trace_id:032x}"
        etl, load, prefix = spans["etl"], spans["load"], spans["sleepy"]
        # one trace, the client's; parent chain client -> etl -> load -> prefix
        assert {etl["traceId"], load["traceId"], prefix["traceId"]} == {trace_hex}
        assert etl["parentSpanId"] == f"{ctx.span_id:016x}"
        assert etl["spanId"] == f"{otel_span_id(etl_id):016x}"
        assert load["parentSpanId"] == etl["spanId"]
        assert load["spanId"] == f"{otel_span_id(load_id):016x}"
        assert prefix["parentSpanId"] == load["spanId"]
        # client code inside the block lands inside the dask span
        assert http.parent.span_id == otel_span_id(load_id)
        assert http.context.trace_id == ctx.trace_id
        # times inside the client's wall-clock window. Task times come from the
        # workers, shifted by each worker's estimate of its clock offset to the
        # scheduler (Worker.scheduler_delay, from heartbeat round trips: on one
        # machine all of it is estimation error, larger on a loaded machine): allow
        # for the largest estimate seen around the computation, and 0.3 s more.
        largest_offset = max(abs(d) for sample in delays for d in sample.values())
        skew = 300_000_000 + int(largest_offset * 1e9)
        for s in (etl, load, prefix):
            start, end = int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"])
            assert t_enter - skew <= start <= end <= t_exit + skew
        assert load["attributes"][names.SPAN_NAME] == ["etl", "load"]
        assert load["attributes"][names.SPAN_TASK_COUNT] == 6
        assert prefix["attributes"][names.TASK_PREFIX] == "sleepy"
        assert prefix["attributes"][names.TASK_GROUP_TASK_COUNT] == 6
        assert etl["resource"]["service.name"] == "test-scheduler"
        assert etl["resource"][names.SCHEDULER_ADDRESS] == address

        def scheduler_metrics(dask_scheduler, span_id):
            return dict(dask_scheduler.extensions["spans"].spans[span_id].cumulative_worker_metrics)

        def exported():
            # (the scheduler's figures once they hold what the worker recorded: its
            # heartbeat that brings the last of them may come after the span's
            # export, at whatever time the load allows)
            expected = client.run_on_scheduler(scheduler_metrics, span_id=load_id)
            recorded = client.run(worker_span_metrics, span_id=load_id).values()
            if not holds_all(expected, *recorded):
                return None
            out = {}
            for metric in (names.SPAN_ACTIVITY_TIME, names.SPAN_ACTIVITY_DATA,
                           names.SPAN_ACTIVITY_COUNT, names.SPAN_ACTIVITY_CUSTOM):
                for attrs, value in otlp_receiver.latest_sums(metric).items():
                    a = dict(attrs)
                    if a[names.SPAN_NAME] == "etl/load":
                        out[a[names.CONTEXT], a[names.TASK_PREFIX], a[names.ACTIVITY],
                            a[names.UNIT]] = value
            return out if set(out) == set(expected) and all(
                out[k] == pytest.approx(v, rel=1e-6, abs=1e-9) for k, v in expected.items()
            ) else None

        got = wait_for(exported, timeout=30, interval=0.2)
        assert any(k[2] == "thread-noncpu" for k in got)
        sleep_seconds = sum(v for k, v in got.items() if k[1] == "sleepy"
                            and k[2] in ("thread-cpu", "thread-noncpu"))
        assert sleep_seconds == pytest.approx(0.6, abs=0.15)


def fails_on_odd(x: int) -> int:
    if x % 2:
        raise ValueError(f"odd {x}")
    time.sleep(0.01)
    return x


def exemplars_of(receiver, metric_name: str, span_name: str) -> list:
    """The exemplars of a metric's points for one ``dask.span.name``, off the wire."""
    out = []
    for req in list(receiver.metric_requests):
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name != metric_name:
                        continue
                    data = m.sum if m.HasField("sum") else m.histogram
                    for dp in data.data_points:
                        attrs = {kv.key: kv.value.string_value for kv in dp.attributes}
                        if attrs.get(names.SPAN_NAME) == span_name:
                            out += [(attrs.get(names.TASK_PREFIX), e)
                                    for e in dp.exemplars]
    return out


def test_erred_tasks_and_exemplars_over_otlp_from_real_processes(cluster, otlp_receiver):
    address, _ = cluster
    tracer = TracerProvider().get_tracer("client-app")
    with Client(address, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        with tracer.start_as_current_span("client request") as request:
            with span("fails") as span_id:
                futures = client.map(fails_on_odd, range(40))
                client.gather(futures, errors="skip")
        del futures  # (released before export: the errors stay counted)
        trace_hex = f"{request.get_span_context().trace_id:032x}"
        prefix_hex = f"{prefix_span_id(span_id, 'fails_on_odd'):016x}"

        def exported():
            spans = otlp_receiver.spans()
            tasks = [s for s in spans if names.TASK_KEY in s["attributes"]]
            dask_spans = [s for s in spans if s["name"] == "fails"]
            return (dask_spans, tasks) if dask_spans and tasks else None

        (dask_span,), tasks = wait_for(exported, timeout=30)
        assert dask_span["attributes"][names.SPAN_ERRED_COUNT] == 20
        assert len(tasks) == 10
        workers = set(client.scheduler_info()["workers"])
        for task in tasks:
            assert task["traceId"] == trace_hex
            assert task["parentSpanId"] == prefix_hex
            assert task["status"]["code"] == 2  # STATUS_CODE_ERROR
            assert task["attributes"][names.WORKER_ADDRESS] in workers
            (event,) = task["events"]
            attrs = {a["key"]: a["value"]["stringValue"] for a in event["attributes"]}
            assert event["name"] == "exception"
            assert attrs["exception.type"] == "ValueError"
            assert attrs["exception.message"].startswith("odd ")
            assert 'raise ValueError(f"odd {x}")' in attrs["exception.stacktrace"]

        def exemplars():
            found = exemplars_of(otlp_receiver, names.SPAN_ACTIVITY_TIME, "fails")
            return found if any(p == "fails_on_odd" for p, _ in found) else None

        for prefix, exemplar in wait_for(exemplars, timeout=30):
            assert exemplar.trace_id.hex() == trace_hex
            if prefix == "fails_on_odd":
                assert exemplar.span_id.hex() == prefix_hex


CLIENT = (
    "import sys, json, distributed\n"
    "from dask_otel_spans import span, wait_for_export\n"
    "with distributed.Client(sys.argv[1]) as client:\n"
    "    with span('light client'):\n"
    "        client.submit(sum, [1, 2]).result()\n"
    "    state = wait_for_export(client)\n"
    "    print(json.dumps([state.handed_over, sorted(m for m in sys.modules if"
    " m.startswith(('dask_otel_spans.scheduler', 'dask_otel_spans.transport',"
    " 'dask_otel_spans.export', 'dask_otel_spans.sdk', 'opentelemetry.sdk')))]))\n"
)


def test_a_client_loads_nothing_of_the_scheduler_export_side_or_the_sdk(cluster):
    """A real client process after a real ``span()`` and ``wait_for_export``."""
    address, _ = cluster
    out = subprocess.run([sys.executable, "-c", CLIENT, address],
                         capture_output=True, text=True, timeout=120, check=True)
    handed_over, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert handed_over >= 1 and loaded == []
