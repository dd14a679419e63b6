"""Providers for the plugin under test: SDK providers exporting to memory, and a
providers factory (``otel-spans.providers``) that fails."""
from __future__ import annotations

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from dask_otel_spans import names
from support.polling import async_wait_for


class MemoryProviders:
    """SDK providers exporting to memory: ``spans()`` and ``points()``."""

    def __init__(self) -> None:
        self.span_exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.span_exporter))
        self.metric_reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.metric_reader])

    def spans(self) -> list:
        return list(self.span_exporter.get_finished_spans())

    def dask_spans(self) -> list:
        return [s for s in self.spans() if "dask.span.id" in (s.attributes or {})]

    def by_name(self, name: str) -> list:
        return [s for s in self.spans() if s.name == name]

    def task_spans(self, prefix: str | None = None) -> list:
        """The task spans (of ``prefix``, when given)."""
        return [s for s in self.spans() if names.TASK_KEY in (s.attributes or {})
                and (prefix is None or s.attributes[names.TASK_PREFIX] == prefix)]

    def prefix_span(self, prefix: str):
        """The one prefix span of ``prefix``."""
        (found,) = [s for s in self.by_name(prefix)
                    if names.TASK_GROUP_COUNT in (s.attributes or {})]
        return found

    async def first(self, name: str):
        """The first span named ``name``, once one was exported."""
        await async_wait_for(lambda: self.by_name(name))
        return self.by_name(name)[0]

    def points(self, name: str | None = None) -> list[tuple[str, dict, float]]:
        data = self.metric_reader.get_metrics_data()
        out = []
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if name is not None and m.name != name:
                        continue
                    for dp in m.data.data_points:
                        value = getattr(dp, "value", None)
                        if value is None:
                            value = dp.sum
                        out.append((m.name, dict(dp.attributes), value))
        return out

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def failing_providers():
    """A providers factory (``otel-spans.providers``) that fails when called."""
    raise RuntimeError("no collector credentials")
