"""The two ways the ender ends spans (``export/writers.py``): built directly as
``ReadableSpan``s (the package's own providers) and through the tracer API (a user's
provider) give the same OTLP, field by field, for a representative workload, under
the SDK's samplers and span limits. ``.ci/run`` runs this file against the oldest
supported OpenTelemetry SDK too."""
from __future__ import annotations

import uuid

import pytest
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    TraceIdRatioBased,
)
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.ender import HandOver, SpanEnder
from dask_otel_spans.export.pipeline import ExportPipeline
from dask_otel_spans.export.task_spans import TaskEvent, TaskSpanFields
from dask_otel_spans.export.traces import PrefixSpanFields, SpanFields
from dask_otel_spans.export.writers import ApiWriter, DirectWriter, span_writer
from dask_otel_spans.protocol.propagation import (
    parse_carried,
    prefix_span_id,
    resolve_chain,
    task_span_id,
)
from dask_otel_spans.sdk.providers import Providers, resolve_providers

RESOURCE = Resource.create({"service.name": "dask-scheduler",
                            "service.instance.id": "5c0ffee0-0000-4000-8000-000000000001"})
LOAD = "9cd7531a-e510-4f61-837a-ca1e4437bd90"
#: root dask spans (their trace ids spread, so that a ratio sampler drops some)
ROOTS = [str(uuid.uuid5(uuid.NAMESPACE_OID, f"root-{i}")) for i in range(8)]
#: the client's span (trace flags sampled and random, with a trace state)
CLIENT = {LOAD: {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-03",
                 "tracestate": "vendor=abc,other=1"}}
UNSAMPLED = "5d8e2a4c-6b1f-4c3a-9e7d-0f1a2b3c4d5e"
UNSAMPLED_CLIENT = {UNSAMPLED: {
    "traceparent": "00-1bf7651916cd43dd8448eb211c80319c-c7ad6b7169203331-00",
    "tracestate": "vendor=def"}}
CALLERS = [SpanContext(0x1234 + i, 0x99 + i, is_remote=True,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED)) for i in range(3)]
STACK = 'Traceback (most recent call last):\n  File "etl.py", line 3\nValueError: bad 3'


def erred_task(span_id: str, key: str, start: float) -> TaskSpanFields:
    """A task span of an erred task: an action event and its ``exception`` event."""
    start_ns = int(start * 1e9)
    return TaskSpanFields(
        "read", task_span_id(span_id, key), start_ns, start_ns + 2_000_000,
        {names.TASK_PREFIX: "read", names.TASK_KEY: key,
         "dask.worker.address": "tcp://10.0.0.2:4000", "error.type": "ValueError"},
        [TaskEvent("transfer", start_ns + 10, {"dask.task.action.duration": 0.001}),
         TaskEvent(names.EXCEPTION_EVENT, start_ns + 2_000_000,
                   {names.EXCEPTION_TYPE: "ValueError",
                    "exception.message": "bad record 3", "exception.stacktrace": STACK})],
        "ValueError")


def load_span() -> SpanFields:
    """A dask span below a client's span, linked to callers, with prefix spans (one
    erred) and task spans."""
    ids = resolve_chain([LOAD], parse_carried(CLIENT) or {})
    read = PrefixSpanFields(
        "read", prefix_span_id(LOAD, "read"), 101_000_000_000, 103_500_000_000,
        {names.TASK_PREFIX: "read", names.TASK_GROUP_COUNT: 2,
         "dask.task_group.task_count": 9, "dask.metrics.thread-cpu.seconds": 3.0,
         "error.type": "ValueError"},
        [erred_task(LOAD, "('read-abc', 3)", 102.0),
         TaskSpanFields("read", task_span_id(LOAD, "('read-abc', 4)"), 101_000_000_000,
                        101_500_000_000, {names.TASK_PREFIX: "read",
                                          names.TASK_KEY: "('read-abc', 4)",
                                          "dask.task.nbytes": 28}, [], None)],
        "1 tasks erred: 1 ValueError")
    total = PrefixSpanFields("sum", prefix_span_id(LOAD, "sum"), 104_000_000_000,
                             105_000_000_000, {names.TASK_PREFIX: "sum"})
    return SpanFields(
        "load", ids, 100_000_000_000, 105_000_000_000,
        {names.SPAN_NAME: ["etl", "load"], "dask.span.id": LOAD,
         "dask.span.task_count": 10, "dask.span.erred_count": 1,
         "dask.span.task_duration": 5.5, "dask.span.close_reason": "client",
         "dask.span.code": "x" * 300, "error.type": "ValueError",
         "dask.metrics.thread-cpu.seconds": 3.5, "dask.span.incomplete": False},
        "1 tasks erred: 1 ValueError", [read, total], links=list(CALLERS))


def root_span(dask_id: str) -> SpanFields:
    """A root dask span without prefix spans: its task spans right below it, and
    attributes of every kind, some past the limits, one the SDK cleans."""
    ids = resolve_chain([dask_id], {})
    attributes = {f"dask.metrics.activity-{i}.seconds": float(i) for i in range(130)}
    attributes.update({names.SPAN_NAME: ["etl", "y" * 40], "dask.span.id": dask_id,
                       "flag": True, "mixed": ["a", 1], "empty": []})
    return SpanFields(f"root {dask_id[-2:]} " + "z" * 30, ids, 200_000_000_000,
                      201_000_000_000, attributes, None, [],
                      [erred_task(dask_id, f"read-{dask_id[-2:]}", 200.1)])


def unsampled_client_span() -> SpanFields:
    """A dask span below a client's span that was not sampled (a trace state too)."""
    ids = resolve_chain([UNSAMPLED], parse_carried(UNSAMPLED_CLIENT) or {})
    return SpanFields("not sampled", ids, 110_000_000_000, 111_000_000_000,
                      {names.SPAN_NAME: ["etl", "not sampled"], "dask.span.id": UNSAMPLED},
                      None, [])


def workload() -> list[SpanFields]:
    return ([load_span()] + [root_span(dask_id) for dask_id in ROOTS]
            + [unsampled_client_span()])


class Recorder(SpanProcessor):
    """Keeps every span ended (sampled or only recorded) and counts ``on_start``."""

    def __init__(self) -> None:
        self.ended: list = []
        self.started = 0

    def on_start(self, span, parent_context=None) -> None:
        self.started += 1

    def on_end(self, span) -> None:
        self.ended.append(span)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # (the base class returned None on older SDKs: "not flushed")


class RecordOnlyReads(Sampler):
    """Records the spans named ``read`` without sampling them, samples the others;
    adds an attribute and a trace state entry to each."""

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None,
                      links=None, trace_state=None) -> SamplingResult:
        decision = Decision.RECORD_ONLY if name == "read" else Decision.RECORD_AND_SAMPLE
        return SamplingResult(decision, {**(attributes or {}), "sampler.saw": name},
                              TraceState([("sampler", "1")]))

    def get_description(self) -> str:
        return "RecordOnlyReads"


CONFIGS = {
    "default": {},
    "span limits": {"span_limits": SpanLimits(
        max_span_attributes=8, max_span_attribute_length=10, max_events=1,
        max_event_attributes=1, max_links=1, max_attribute_length=12)},
    # (a UUID's low 64 bits start 0b10: 0.625 keeps about half of the roots)
    "ratio sampler": {"sampler": ParentBased(TraceIdRatioBased(0.625))},
    "record only": {"sampler": RecordOnlyReads()},
    "roots dropped": {"sampler": ParentBased(ALWAYS_OFF)},
}
#: the span limits from the environment
LIMITS_ENVIRON = {"OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "16",
                  "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "20", "OTEL_SPAN_EVENT_COUNT_LIMIT": "1",
                  "OTEL_SPAN_LINK_COUNT_LIMIT": "2", "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "8"}


def ended(provider_args: dict, owned: bool) -> tuple[list, Recorder]:
    """The spans the workload ends in a fresh provider, and its processor."""
    provider = TracerProvider(resource=RESOURCE, **provider_args)
    recorder = Recorder()
    provider.add_span_processor(recorder)
    ender = SpanEnder(span_writer(provider, owned=owned))
    for fields in workload():
        ender.export(fields)
    return recorder.ended, recorder


@pytest.fixture(params=[*CONFIGS, "environment limits"])
def both_paths(request, monkeypatch):
    """``(direct, api)``: the spans each path ended, for one sampler or limits."""
    if request.param == "environment limits":
        for key, value in LIMITS_ENVIRON.items():
            monkeypatch.setenv(key, value)
        args: dict = {}
    else:
        args = CONFIGS[request.param]
    return ended(args, owned=True)[0], ended(args, owned=False)[0]


def otlp(spans: list) -> dict:
    """The OTLP request of ``spans`` as the SDK's encoder makes it, as a dict."""
    return MessageToDict(encode_spans(spans))


def otlp_spans(spans: list) -> list[dict]:
    (resource_spans,) = otlp(spans)["resourceSpans"]
    (scope_spans,) = resource_spans["scopeSpans"]
    return scope_spans["spans"]


FIELDS = {
    "names": ("name",),
    "ids": ("traceId", "spanId"),
    "parents": ("parentSpanId",),
    "times": ("startTimeUnixNano", "endTimeUnixNano"),
    "kind": ("kind",),
    "attributes": ("attributes", "droppedAttributesCount"),
    "events": ("events", "droppedEventsCount"),
    "links": ("links", "droppedLinksCount"),
    "status": ("status",),
    "flags and trace state": ("flags", "traceState"),
}


@pytest.mark.parametrize("field", FIELDS)
def test_both_paths_give_the_same_otlp_span_field(both_paths, field):
    direct, api = both_paths
    keys = FIELDS[field]
    assert ([{k: s.get(k) for k in keys} for s in otlp_spans(direct)]
            == [{k: s.get(k) for k in keys} for s in otlp_spans(api)])


@pytest.mark.parametrize("part", ["resource", "scope", "schemaUrl"])
def test_both_paths_give_the_same_otlp_resource_and_scope(both_paths, part):
    direct, api = both_paths
    (direct_resource,), (api_resource,) = (otlp(direct)["resourceSpans"],
                                           otlp(api)["resourceSpans"])
    if part == "scope":
        direct_resource, api_resource = (direct_resource["scopeSpans"][0],
                                         api_resource["scopeSpans"][0])
    assert direct_resource.get(part) == api_resource.get(part)


def span_context(context: SpanContext | None) -> tuple | None:
    """A span context's every field (OTLP carries the trace flags of none)."""
    if context is None:
        return None
    return (context.trace_id, context.span_id, context.is_remote, int(context.trace_flags),
            context.trace_state.to_header())


def test_both_paths_give_the_same_span_contexts_and_parents(both_paths):
    direct, api = both_paths
    assert ([(span_context(s.context), span_context(s.parent)) for s in direct]
            == [(span_context(s.context), span_context(s.parent)) for s in api])


def test_the_workload_ends_spans_of_every_kind():
    """(So that the comparisons above compare something.)"""
    spans = otlp_spans(ended({}, owned=True)[0])
    assert {"events", "links", "status", "parentSpanId"} <= set().union(*spans)
    assert len(spans) == 1 + 3 + 2 * len(ROOTS) + 1


def test_a_dropped_dask_span_ends_none_of_its_children():
    assert ended({"sampler": ALWAYS_OFF}, owned=True)[0] == []


def test_direct_spans_share_the_providers_resource_and_the_tracers_scope():
    spans, _ = ended({}, owned=True)
    assert {id(s.resource) for s in spans} == {id(RESOURCE)}
    assert len({id(s.instrumentation_scope) for s in spans}) == 1


def test_direct_spans_are_never_started_in_the_processors():
    spans, recorder = ended({}, owned=True)
    assert spans and recorder.started == 0


def writer_of(providers: Providers) -> type:
    """The type of writer the pipeline built over ``providers`` ends spans with."""
    pipeline = ExportPipeline.build(providers, PluginConfig.from_dask_config())
    try:
        return type(pipeline.ender.writer)
    finally:
        pipeline.shut_down(5)


#: the package builds its own providers: traces and metrics nowhere but the console
CONSOLE = {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "none"}


def test_the_packages_own_providers_get_spans_built_directly(tmp_path):
    providers = resolve_providers(environ=CONSOLE, use_global=False,
                                  output_dir=str(tmp_path), live_records=False)
    assert writer_of(providers) is DirectWriter


def test_a_given_tracer_provider_keeps_the_api_path(tmp_path):
    providers = resolve_providers(tracer_provider=TracerProvider(resource=RESOURCE),
                                  environ=CONSOLE, use_global=False,
                                  output_dir=str(tmp_path), live_records=False)
    assert writer_of(providers) is ApiWriter


def test_a_users_tracer_provider_gets_on_start_for_every_span():
    provider = TracerProvider(resource=RESOURCE)
    recorder = Recorder()
    provider.add_span_processor(recorder)
    pipeline = ExportPipeline.build(Providers(tracer_provider=provider),
                                    PluginConfig.from_dask_config())
    try:
        pipeline.ender.end(HandOver(("etl",), (LOAD,), CLIENT, None, 10.0, True, "client",
                                    enter=8.0, exit=10.0))
        assert pipeline.flush(5)
    finally:
        pipeline.shut_down(5)
    assert len(recorder.ended) == recorder.started == 1


def exception_log_records(owned: bool) -> list[tuple]:
    """Trace id, span id, trace flags and attributes of the exception log events the
    workload makes (``OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN=logs``)."""
    exporter = InMemoryLogExporter()
    logger_provider = LoggerProvider(resource=RESOURCE)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    provider = TracerProvider(resource=RESOURCE)
    ender = SpanEnder(span_writer(provider, owned=owned), exception_events=False,
                      logger_provider=logger_provider)
    for fields in workload():
        ender.export(fields)
    records = [getattr(r, "log_record", r) for r in exporter.get_finished_logs()]
    return [(r.trace_id, r.span_id, int(r.trace_flags), dict(r.attributes or {}))
            for r in records]


def test_both_paths_make_exception_log_events_in_the_task_spans_context():
    assert exception_log_records(owned=True) == exception_log_records(owned=False)


def factory_providers() -> tuple[TracerProvider, None]:
    """An ``otel-spans.providers`` factory: the user's own tracer provider."""
    return TracerProvider(resource=RESOURCE), None


def test_a_factorys_tracer_provider_keeps_the_api_path():
    from dask_otel_spans.transport.providers import build_providers
    from dask_otel_spans.transport.spec import PipelineSpec

    spec = PipelineSpec(PluginConfig.from_dask_config(),
                        providers_factory=f"{__name__}:factory_providers")
    assert writer_of(build_providers(spec)) is ApiWriter
