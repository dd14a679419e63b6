"""How the export side builds its providers, as plain data that can travel to the
export process (:class:`PipelineSpec`)."""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dask_otel_spans.config import PluginConfig
from dask_otel_spans.sdk.delivery import Delivery
from dask_otel_spans.sdk.otlp import ConfigurationError
from dask_otel_spans.sdk.providers import Providers, check_environ, resolve_providers
from dask_otel_spans.sdk.spool import Spool, resolve_directory


@dataclass(frozen=True)
class PipelineSpec:
    """Everything needed to build a pipeline's providers without live objects, so
    that it can travel to another process.

    Parameters
    ----------
    config:
        The plugin's settings
    environ:
        Mapping to read ``OTEL_*`` variables from; None for the building process's
        environment
    scheduler_address:
        For the resource attribute ``dask.scheduler.address``
    providers_factory:
        ``"module:callable"`` returning ``(tracer_provider, meter_provider)`` (either
        may be None), called without arguments where the pipeline is built; None
        builds providers from ``OTEL_*`` as the plugin does
    """

    config: PluginConfig
    environ: Mapping[str, str] | None = None
    scheduler_address: str | None = None
    providers_factory: str | None = None

    def resolve_providers(self, **explicit: Any) -> Providers:
        """The providers: ``explicit`` (``tracer_provider``, ``meter_provider``,
        ``use_global``), then the factory, then ``OTEL_*`` and the embedded default."""
        if self.providers_factory and not any(
            explicit.get(k) is not None for k in ("tracer_provider", "meter_provider")
        ):
            tracer_provider, meter_provider = load_factory(self.providers_factory)()
            where = f"the providers of {self.providers_factory}"
            return Providers(
                tracer_provider=tracer_provider,
                meter_provider=meter_provider,
                owned=[p for p in (tracer_provider, meter_provider) if p is not None],
                traces_to=where if tracer_provider is not None else "nowhere",
                metrics_to=where if meter_provider is not None else "nowhere",
            )
        return resolve_providers(
            environ=self.environ,
            scheduler_address=self.scheduler_address,
            output_dir=self.config.output_dir,
            metric_series_limit=self.config.max_series,
            delivery=delivery_of(self.config),
            **explicit,
        )


    def check(self) -> None:
        """Raise :class:`~dask_otel_spans.sdk.providers.ConfigurationError` (saying
        which setting, its value and what it accepts) when providers could not be
        built from this spec's configuration: checked in the scheduler before any
        export process starts."""
        if self.providers_factory:
            try:
                load_factory(self.providers_factory)
            except Exception as e:
                raise ConfigurationError(
                    f"otel-spans.providers={self.providers_factory!r} cannot be "
                    f"loaded ({type(e).__name__}: {e})"
                ) from None
            return
        check_environ(os.environ if self.environ is None else self.environ)


def delivery_of(config: PluginConfig) -> Delivery:
    """The delivery (not started) of the spool settings in ``config``."""
    return Delivery(Spool(resolve_directory(config.spool_directory),
                          config.spool_max_memory, config.spool_max_disk))


def load_factory(path: str) -> Callable[[], tuple[Any, Any]]:
    """The callable named by ``"package.module:attribute"``."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(
            f"providers factory {path!r} is not of the form 'package.module:callable'"
        )
    factory: Callable[[], tuple[Any, Any]] = getattr(
        importlib.import_module(module_name), attribute)
    if not callable(factory):
        raise TypeError(f"providers factory {path!r} is not callable")
    return factory
