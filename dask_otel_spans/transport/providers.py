"""The providers a :class:`~dask_otel_spans.transport.spec.PipelineSpec` describes,
built where the export session runs (this module imports the OTel SDK)."""
from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

from dask_otel_spans.config import PluginConfig
from dask_otel_spans.sdk.delivery import Delivery
from dask_otel_spans.sdk.providers import Providers, resolve_providers
from dask_otel_spans.sdk.spool import Spool, resolve_directory
from dask_otel_spans.transport.spec import PipelineSpec, load_factory

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider
    from typing_extensions import Unpack  # (typing's: Python >= 3.11)


class ExplicitProviders(TypedDict, total=False):
    """What :func:`build_providers` is given beside the spec (the plugin's
    arguments)."""

    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    use_global: bool


def build_providers(spec: PipelineSpec, **explicit: Unpack[ExplicitProviders]) -> Providers:
    """The providers: ``explicit`` (``tracer_provider``, ``meter_provider``,
    ``use_global``), then the spec's factory, then ``OTEL_*`` and the embedded
    default."""
    if spec.providers_factory and not any(
        explicit.get(k) is not None for k in ("tracer_provider", "meter_provider")
    ):
        tracer_provider, meter_provider = load_factory(spec.providers_factory)()
        where = f"the providers of {spec.providers_factory}"
        return Providers(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            owned=[p for p in (tracer_provider, meter_provider) if p is not None],
            traces_to=where if tracer_provider is not None else "nowhere",
            metrics_to=where if meter_provider is not None else "nowhere",
        )
    return resolve_providers(
        environ=spec.environ,
        scheduler_address=spec.scheduler_address,
        output_dir=spec.config.output_dir,
        metric_series_limit=spec.config.max_series,
        delivery=_delivery_of(spec.config),
        **explicit,
    )


def _delivery_of(config: PluginConfig) -> Delivery:
    """The delivery (not started) of the spool settings in ``config``."""
    return Delivery(Spool(resolve_directory(config.spool_directory),
                          config.spool_max_memory, config.spool_max_disk))
