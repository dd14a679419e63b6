"""``profile.otlp`` into the real Collector of the Jaeger binary: ``deploy/jaeger/config.yaml``
with the Collector's alpha feature gate ``service.profilesSupport`` and a ``profiles``
pipeline (``otlp`` receiver to the ``debug`` exporter, ``detailed``). A dask span's
prefix profiles go as an OTLP profiles request over gRPC and HTTP; the Collector's log
shows the profile decoded: its functions, and the link to its prefix span. Once from
the sender, over gRPC and HTTP; once from a real ``dask scheduler --preload
dask_otel_spans`` whose workflow burns CPU in ``hot_loop``."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from distributed import Client
from support.jaeger import Jaeger
from support.paths import DEPLOY
from support.polling import wait_for
from support.processes import DaskProcesses
from support.workloads import hot_loop

from dask_otel_spans import names, span, wait_for_export
from dask_otel_spans.export.otlpprofiles import ProfileSender
from dask_otel_spans.export.profiles import PrefixProfile
from dask_otel_spans.export.traces import PrefixSpanFields, SpanFields
from dask_otel_spans.protocol.profiles import Frame, from_stacks
from dask_otel_spans.protocol.propagation import resolve_chain
from dask_otel_spans.sdk.otlpjson import TRACES_FILE, read_spans
from dask_otel_spans.sdk.otlpsend import request_sender

#: runs the Jaeger binary: waits for its build on a fresh machine (tests/conftest.py)
pytestmark = pytest.mark.jaeger


@pytest.fixture(scope="module")
def collector(tmp_path_factory) -> Iterator[Jaeger]:
    """Jaeger's config with a ``profiles`` pipeline to the ``debug`` exporter."""
    tmp = tmp_path_factory.mktemp("jaeger-profiles")
    config = yaml.safe_load((DEPLOY / "jaeger" / "config.yaml").read_text())
    del config["service"]["pipelines"]["metrics"], config["exporters"]["prometheus"]
    config["exporters"]["debug"] = {"verbosity": "detailed"}
    config["service"]["pipelines"]["profiles"] = {"receivers": ["otlp"],
                                                  "exporters": ["debug"]}
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    server = Jaeger(tmp / "config.yaml", tmp / "jaeger.log",
                    args=("--feature-gates=service.profilesSupport",))
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_prefix_profile_reaches_the_collector_linked_to_its_span(collector, protocol):
    endpoint = collector.otlp_grpc if protocol == "grpc" else collector.otlp_http
    sender = ProfileSender(request_sender({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                                           "OTEL_EXPORTER_OTLP_PROTOCOL": protocol},
                                          "profiles"), {"service.name": "profiled"})
    ids = resolve_chain([f"0eadd631-e68b-495e-b072-7765d0d6100{len(protocol)}"], {})
    prefix_span_id = 0x00F067AA0BA90000 + len(protocol)
    prefix = PrefixSpanFields("inc", prefix_span_id, 1_000, 3_000,
                              {names.TASK_PREFIX: "inc"})
    fields = SpanFields("wf", ids, 1_000, 3_000, {}, None, [prefix])
    main, hot = Frame("run", "/x/worker.py", 10), Frame("hot_loop", "/x/jobs.py", 3)
    profile = PrefixProfile(tree=from_stacks([((main, hot), 7), ((main,), 2)]))
    sender.start()
    try:
        sender.send(fields, {"inc": profile})
        assert sender.flush(10)
    finally:
        sender.stop()
    assert (sender.delivered, sender.failed) == (1, 0)
    log = wait_for(lambda: (text := collector.log.read_text())
                   and f"Span ID: Str({prefix_span_id:016x})" in text and text)
    decoded = log[log.rindex(f"Trace ID: Str({ids.trace_id:032x})"):]
    assert f"Span ID: Str({prefix_span_id:016x})" in decoded
    strings = decoded[decoded.index("String table:"):].splitlines()
    assert {"hot_loop", "run", "/x/jobs.py", names.TASK_PREFIX} <= {
        s.strip() for s in strings}
    samples = decoded[decoded.index("Profile #0"):]
    assert "Values: [7]" in samples and "Values: [2]" in samples


@pytest.mark.cluster
def test_profile_otlp_sends_the_hot_prefix_profile_of_a_workflow(collector, tmp_path):
    # (the traces go to the embedded default's files: the profiles' own endpoint)
    env = {"DASK_OTEL_SPANS__PROFILE__OTLP": "true",
           "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT": collector.otlp_grpc,
           "DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL": "5ms",
           "DASK_DISTRIBUTED__WORKER__PROFILE__CYCLE": "200ms"}
    procs = DaskProcesses(env, cwd=str(tmp_path))
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            with span("workflow"):
                client.gather(client.map(hot_loop, [0.6, 0.6], pure=False))
            assert not wait_for_export(client, timeout=30).open
    finally:
        procs.stop()
    spans = read_spans(str(tmp_path / "dask-otel-spans" / TRACES_FILE))
    (hot,) = [s for s in spans if s["name"] == "hot_loop"
              and names.TASK_GROUP_COUNT in s["attributes"]]
    log = wait_for(lambda: (text := collector.log.read_text())
                   and f"Span ID: Str({hot['spanId']})" in text and text)
    decoded = log[log.rindex(f"Trace ID: Str({hot['traceId']})"):]
    assert f"Span ID: Str({hot['spanId']})" in decoded
    strings = {s.strip() for s in decoded[decoded.index("String table:"):].splitlines()}
    assert {"hot_loop", hot_loop.__code__.co_filename} <= strings
