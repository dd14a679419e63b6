"""Where a client's trace context comes from when no span is current: the
OpenTelemetry specification's environment carriers, and what the configured
propagators inject for a context."""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace

from dask_otel_spans.logonce import OnceLogger

logger = logging.getLogger(__name__)
_log_once = OnceLogger(logger)

#: The OTel specification's environment carriers: variable -> carrier key. With no
#: current span, ``span()`` takes its parent context from them
ENVIRONMENT_CARRIERS = {
    "TRACEPARENT": "traceparent",
    "TRACESTATE": "tracestate",
    "BAGGAGE": "baggage",
}

def injected(ctx: otel_context.Context) -> dict[str, str]:
    """The headers the global propagator (``OTEL_PROPAGATORS``) injects for ``ctx``."""
    from opentelemetry import propagate  # (loads the configured propagators)

    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return carrier


def context_from_environment(
    ctx: otel_context.Context | None = None,
    environ: Mapping[str, str] | None = None,
) -> otel_context.Context:
    """``ctx`` (default: the current context) with what the environment carriers
    ``TRACEPARENT``, ``TRACESTATE`` and ``BAGGAGE`` of ``environ`` (default:
    ``os.environ``) carry, extracted by the global propagator (``OTEL_PROPAGATORS``
    decides what is read); ``ctx`` itself when none is set.

    This is how a batch script started by an orchestrator with ``TRACEPARENT`` set
    puts its dask spans in the orchestrator's trace. A ``TRACEPARENT`` that is no
    W3C traceparent is ignored, with one warning.
    """
    if ctx is None:
        ctx = otel_context.get_current()
    env = os.environ if environ is None else environ
    carrier = {key: value for variable, key in ENVIRONMENT_CARRIERS.items()
               if (value := env.get(variable))}
    if not carrier:
        return ctx
    from opentelemetry import propagate  # (loads the configured propagators)

    extracted = propagate.extract(carrier, context=ctx)
    traceparent = carrier.get("traceparent")
    if traceparent is not None and not _is_traceparent(traceparent):
        _log_once(
            "environment-traceparent", "TRACEPARENT %r is not a W3C traceparent; "
            "ignored (dask spans are not parented by it)", traceparent[:80],
        )
    return extracted


def _is_traceparent(value: str) -> bool:
    """Whether ``value`` is a valid W3C traceparent header."""
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    ctx = TraceContextTextMapPropagator().extract({"traceparent": value})
    return trace.get_current_span(ctx).get_span_context().is_valid
