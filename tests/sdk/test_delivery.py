"""Delivery through the providers the package builds from ``OTEL_*``, against real
OTLP receivers (gRPC and HTTP) that go away, come back, or ask to retry later:
nothing held is lost or sent twice, retry hints are respected, figures are honest,
and what another destination's process left is left alone."""
from __future__ import annotations

from collections import Counter

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from support.polling import wait_for
from support.processes import free_port
from support.receivers import OTLPHttpReceiver, OTLPReceiver

from dask_otel_spans.sdk.delivery import Delivery
from dask_otel_spans.sdk.destination import destination_of
from dask_otel_spans.sdk.health import ExportHealth
from dask_otel_spans.sdk.otlpsend import request_sender
from dask_otel_spans.sdk.providers import Providers, resolve_providers
from dask_otel_spans.sdk.resend import resend
from dask_otel_spans.sdk.sending import SendingMetricExporter
from dask_otel_spans.sdk.spool import Spool

PROTOCOLS = ("grpc", "http/protobuf")


def receiver_of(protocol: str, port: int = 0, **kwargs):
    """A started receiver of ``protocol`` (on ``port``: 0 for a free one)."""
    if protocol == "grpc":
        return OTLPReceiver(port=port, **kwargs).start()
    return OTLPHttpReceiver(port=port, **kwargs).start()


def environ_to(receiver, protocol: str, **extra: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "otlp", "OTEL_SEMCONV_EXCEPTION_SIGNAL_OPT_IN": "logs",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
        "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5", "OTEL_BSP_SCHEDULE_DELAY": "20",
        "OTEL_BLRP_SCHEDULE_DELAY": "20", **extra,
    }


def build(environ: dict[str, str], directory, max_memory: int = 10**6) -> Providers:
    return resolve_providers(environ=environ, use_global=False,
                             delivery=Delivery(Spool(str(directory), max_memory, 10**7)))


def end_spans(providers: Providers, n: int, logs: int = 0) -> None:
    tracer = providers.tracer_provider.get_tracer("test")
    for i in range(n):
        with tracer.start_as_current_span(f"span-{i}"):
            pass
    if logs:
        from opentelemetry._logs import LogRecord

        logger = providers.logger_provider.get_logger("test")
        for i in range(logs):
            logger.emit(LogRecord(body=f"record-{i}"))
    providers.tracer_provider.force_flush()
    if logs:
        providers.logger_provider.force_flush()


def close(providers: Providers) -> None:
    providers.redelivery.close(0.5)
    for provider in providers.owned:
        provider.shutdown()


def waiting(providers: Providers, signal: str = "traces") -> int:
    return providers.delivery()[signal].waiting


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_what_ends_while_the_receiver_is_down_arrives_once_when_it_is_back(
        protocol, tmp_path):
    receiver = receiver_of(protocol)
    port = receiver.port
    receiver.stop()
    providers = build(environ_to(receiver, protocol), tmp_path)
    try:
        end_spans(providers, 6, logs=2)
        wait_for(lambda: waiting(providers) == 6 and waiting(providers, "logs") == 2)
        back = receiver_of(protocol, port=port)
        try:
            assert providers.redelivery.drain(20)
            ids = [s["spanId"] for s in back.spans()]
            assert sorted(ids) == sorted(set(ids)) and len(ids) == 6
            assert sorted(r.body.string_value for _, r in _records(back)) == [
                "record-0", "record-1"]
            assert providers.delivery()["traces"].delivered == 6
        finally:
            back.stop()
    finally:
        close(providers)


def _records(receiver):
    records = receiver.log_records()
    return [r if isinstance(r, tuple) else (None, r) for r in records]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_retry_delay_the_receiver_asks_for_is_respected(protocol, tmp_path):
    delay = 0.6
    hint = {"retry_delay": delay} if protocol == "grpc" else {"retry_after": delay}
    receiver = receiver_of(protocol, unavailable=3, **hint)
    # (the four spans in one batch, the flush's: no timed export splits them)
    environ = {**environ_to(receiver, protocol), "OTEL_BSP_SCHEDULE_DELAY": "60000"}
    providers = build(environ, tmp_path)
    try:
        end_spans(providers, 4)
        assert providers.redelivery.drain(20)
        assert len({s["spanId"] for s in receiver.spans()}) == 4
        # three refusals, then the answer: each attempt waits as long as the refusal
        # before it asked
        gaps = [b - a for a, b in zip(receiver.attempts, receiver.attempts[1:],
                                      strict=False)]
        assert len(gaps) == 3
        assert min(gaps) >= delay * 0.95
    finally:
        close(providers)
        receiver.stop()


def test_nothing_counts_as_delivered_or_flushed_while_anything_is_held(tmp_path):
    receiver = OTLPReceiver(port=free_port())  # (never started)
    providers = build(environ_to(receiver, "grpc"), tmp_path)
    try:
        end_spans(providers, 3)
        wait_for(lambda: waiting(providers) == 3)
        figures = providers.delivery()["traces"]
        assert figures.delivered == 0 and figures.failed == 0
        assert providers.delivering() is False
    finally:
        close(providers)


def test_memory_stays_within_max_memory_and_the_rest_goes_to_disk(tmp_path):
    receiver = OTLPReceiver(port=free_port())  # (never started)
    providers = build(environ_to(receiver, "grpc"), tmp_path, max_memory=1)
    try:
        end_spans(providers, 5)
        wait_for(lambda: waiting(providers) == 5)
        figures = providers.delivery()["traces"]
        assert figures.held == 0 and figures.spooled == 5
        assert providers.spool_directory == str(tmp_path)
    finally:
        close(providers)


@pytest.mark.parametrize("temporality, held", [("delta", True), ("cumulative", False)])
def test_only_delta_metric_points_are_held(temporality, held, tmp_path, monkeypatch):
    receiver = OTLPReceiver(port=free_port())  # (never started)
    # (the SDK's metric exporter reads its preference from the process's environment)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", temporality)
    environ = environ_to(receiver, "grpc", OTEL_METRICS_EXPORTER="otlp")
    providers = build(environ, tmp_path)
    try:
        assert ("metrics" in providers.redelivery.signals) is held
    finally:
        close(providers)


def test_providers_given_to_the_package_keep_their_own_exporters(tmp_path, memory):
    providers = resolve_providers(
        tracer_provider=memory.tracer_provider, meter_provider=memory.meter_provider,
        use_global=False, delivery=Delivery(Spool(str(tmp_path), 10, 10)))
    assert providers.redelivery is None


def test_delta_metric_points_missed_in_an_outage_arrive_when_it_is_back(
        tmp_path, monkeypatch):
    receiver = OTLPReceiver().start()
    port = receiver.port
    receiver.stop()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    providers = build(environ_to(receiver, "grpc", OTEL_METRICS_EXPORTER="otlp"),
                      tmp_path)
    try:
        counter = providers.meter_provider.get_meter("test").create_counter("rows")
        counter.add(5)
        providers.meter_provider.force_flush()  # (the reader's export: held)
        wait_for(lambda: waiting(providers, "metrics") >= 1)
        counter.add(2)
        back = OTLPReceiver(port=port).start()
        try:
            providers.meter_provider.force_flush()
            assert providers.redelivery.drain(20)
            values = [dp.as_int for req in back.metric_requests
                      for rm in req.resource_metrics for sm in rm.scope_metrics
                      for m in sm.metrics if m.name == "rows" for dp in m.sum.data_points]
            assert values == [5, 2]  # (oldest first, each delta once)
        finally:
            back.stop()
    finally:
        close(providers)


def _sums(receiver, name: str) -> list[tuple[int, int]]:
    """(value, temporality) of each point of the sum ``name`` the receiver took."""
    return [(point.as_int, metric.sum.aggregation_temporality)
            for request in receiver.metric_requests for rm in request.resource_metrics
            for sm in rm.scope_metrics for metric in sm.metrics if metric.name == name
            for point in metric.sum.data_points]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_cumulative_metric_points_are_sent_with_each_export(protocol, tmp_path):
    receiver = receiver_of(protocol)
    providers = build(environ_to(receiver, protocol, OTEL_METRICS_EXPORTER="otlp"),
                      tmp_path)
    try:
        counter = providers.meter_provider.get_meter("test").create_counter("rows")
        counter.add(5)
        assert providers.meter_provider.force_flush()
        counter.add(2)
        assert providers.meter_provider.force_flush()
        assert _sums(receiver, "rows") == [(5, 2), (7, 2)]  # (2: cumulative)
        assert providers.delivery()["metrics"].delivered == 2
    finally:
        close(providers)
        receiver.stop()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_cumulative_export_turned_away_for_now_is_sent_again_within_its_timeout(
        protocol, tmp_path):
    hint = {"retry_delay": 0.1} if protocol == "grpc" else {"retry_after": 0.1}
    receiver = receiver_of(protocol, unavailable_metrics=2, **hint)  # (try after 0.1 s)
    providers = build(environ_to(receiver, protocol, OTEL_METRICS_EXPORTER="otlp",
                                 OTEL_EXPORTER_OTLP_TIMEOUT="5"), tmp_path)
    try:
        providers.meter_provider.get_meter("test").create_counter("rows").add(5)
        assert providers.meter_provider.force_flush(timeout_millis=10_000)
        attempts = receiver.metric_attempts
        assert len(attempts) == 3 and attempts[-1] - attempts[0] >= 0.2
        assert _sums(receiver, "rows") == [(5, 2)]
        assert providers.delivery()["metrics"].failed == 0
    finally:
        close(providers)
        receiver.stop()


def test_cumulative_points_that_cannot_be_sent_in_time_are_counted_failed_not_held(
        tmp_path, caplog):
    receiver = OTLPReceiver(port=free_port())  # (never started)
    environ = environ_to(receiver, "grpc", OTEL_METRICS_EXPORTER="otlp")
    providers = build(environ, tmp_path)
    try:
        providers.meter_provider.get_meter("test").create_counter("rows").add(5)
        providers.meter_provider.force_flush()  # (tried for the exporter's 0.5 s)
        assert providers.delivery()["metrics"].failed == 1
        assert "metrics" not in providers.redelivery.signals
        assert "cannot export metric points" in caplog.text
    finally:
        close(providers)


def test_a_cumulative_export_after_shutdown_fails_without_sending(tmp_path):
    receiver = receiver_of("grpc")
    reader = InMemoryMetricReader()
    MeterProvider(metric_readers=[reader]).get_meter("t").create_counter("rows").add(1)
    environ = environ_to(receiver, "grpc", OTEL_METRICS_EXPORTER="otlp")
    exporter = SendingMetricExporter(OTLPMetricExporter(insecure=True),
                                     request_sender(environ, "metrics"),
                                     ExportHealth("metrics", receiver.endpoint))
    try:
        exporter.shutdown()
        assert exporter.export(reader.get_metrics_data()) == MetricExportResult.FAILURE
        assert receiver.metric_attempts == []
    finally:
        receiver.stop()


def test_what_is_held_for_another_destination_is_said_once_without_secrets(
        tmp_path, caplog):
    other = {**environ_to(OTLPReceiver(port=free_port()), "grpc"),
             "OTEL_EXPORTER_OTLP_ENDPOINT": "http://jane:pass-word@127.0.0.1:9",
             "OTEL_EXPORTER_OTLP_HEADERS": "api-key=key-of-a"}
    left = Spool(str(tmp_path), max_memory=0, max_disk=10**6)
    left.open()
    for _ in range(2):
        left.put(destination_of(other, "traces"), b"\n\x00", 1)
    left.close()
    receiver = receiver_of("grpc")
    providers = build(environ_to(receiver, "grpc"), tmp_path)
    try:
        end_spans(providers, 1)
        assert providers.redelivery.drain(20)
        assert len(receiver.spans()) == 1
    finally:
        close(providers)
        receiver.stop()
    [line] = [r.getMessage() for r in caplog.records
              if "does not send" in r.getMessage()]
    assert ("2 batches (2 spans) for traces to OTLP grpc http://127.0.0.1:9; left "
            "there") in line
    assert "pass-word" not in caplog.text and "key-of-a" not in caplog.text
    assert "jane" not in line


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_batch_answered_after_the_timeout_is_sent_again_once_and_counted(
        protocol, tmp_path, caplog):
    # the receiver keeps the first request and answers it after the exporter's
    # 0.3 s timeout; the second attempt is answered at once
    receiver = receiver_of(protocol, late=1, delay=1.0)
    # (each batch is one flush: no timed export splits them)
    environ = {**environ_to(receiver, protocol, OTEL_EXPORTER_OTLP_TIMEOUT="0.3"),
               "OTEL_BSP_SCHEDULE_DELAY": "60000", "OTEL_LOGS_EXPORTER": "none"}
    providers = build(environ, tmp_path)
    try:
        end_spans(providers, 4)
        assert providers.redelivery.drain(20)
        end_spans(providers, 2)  # (answered in time: sent once)
        assert providers.redelivery.drain(20)
        copies = Counter(s["spanId"] for s in receiver.spans())
        figures = providers.delivery()["traces"]
    finally:
        close(providers)
        receiver.stop()
    assert sorted(copies.values()) == [1, 1, 2, 2, 2, 2]
    assert len(receiver.attempts) == 3
    assert figures.resent == 4 and figures.delivered == 6
    assert caplog.text.count("got no answer within its 0.3 s timeout") == 1


def test_a_resend_is_said_once_per_outage(caplog):
    health = ExportHealth("traces", "OTLP grpc to http://collector:4317")
    health.outage()
    health.resend(0.5)
    health.resend(0.5)
    health.record(True, 4)  # (recovered)
    health.outage()
    health.resend(0.5)
    assert caplog.text.count("got no answer within its 0.5 s timeout") == 2


def test_a_batch_in_flight_at_close_is_not_sent_again_from_its_spool(tmp_path):
    # (answered after a second, within the exporter's timeout)
    receiver = receiver_of("grpc", late=1, delay=1.0)
    environ = {**environ_to(receiver, "grpc", OTEL_EXPORTER_OTLP_TIMEOUT="5"),
               "OTEL_BSP_SCHEDULE_DELAY": "60000", "OTEL_LOGS_EXPORTER": "none"}
    providers = build(environ, tmp_path)
    try:
        end_spans(providers, 3)
        wait_for(lambda: len(receiver.attempts) == 1)  # (in flight)
        providers.redelivery.close(0.0)  # (its batch written to the spool)
        # another process finds the folder still taken until the answer came
        assert not resend(str(tmp_path), environ, timeout=0.5).resent
        wait_for(lambda: providers.delivery()["traces"].delivered == 3)
        assert not resend(str(tmp_path), environ, timeout=0.5).resent
    finally:
        for provider in providers.owned:
            provider.shutdown()
        receiver.stop()
    assert len(receiver.spans()) == 3
