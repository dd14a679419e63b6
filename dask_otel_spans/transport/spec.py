"""How the export side builds its providers, as plain data that can travel to the
export process (:class:`PipelineSpec`), checked in the scheduler without the SDK
(:mod:`~dask_otel_spans.transport.providers` builds them)."""
from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

from dask_otel_spans.config import PluginConfig
from dask_otel_spans.otelenv import ConfigurationError, check_environ

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

#: A providers factory (``otel-spans.providers``): ``(tracer_provider,
#: meter_provider)``, either may be None; the pipeline owns them (shuts them down)
ProvidersFactory: TypeAlias = (
    "Callable[[], tuple[TracerProvider | None, MeterProvider | None]]")


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

    def check(self) -> None:
        """Raise :class:`~dask_otel_spans.otelenv.ConfigurationError` (saying
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


def load_factory(path: str) -> ProvidersFactory:
    """The callable named by ``"package.module:attribute"``."""
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(
            f"providers factory {path!r} is not of the form 'package.module:callable'"
        )
    factory: ProvidersFactory = getattr(
        importlib.import_module(module_name), attribute)
    if not callable(factory):
        raise TypeError(f"providers factory {path!r} is not callable")
    return factory
