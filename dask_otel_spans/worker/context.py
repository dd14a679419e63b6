"""The OTel context a task runs in on a worker: the span context of its prefix span
inside its dask span (the dask span's own without prefix spans), exactly as the
scheduler exports it, worked out once per dask span and prefix (bounded cache)."""
from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext

from dask_otel_spans import names
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.propagation import (
    parse_carried,
    prefix_span_id,
    resolve_chain,
)

logger = logging.getLogger(__name__)

#: Contexts remembered (one per dask span and prefix that ran lately)
MAX_CONTEXTS = 4096


class TaskContexts:
    """OTel contexts of tasks, by dask span and prefix.

    Parameters
    ----------
    prefix_spans:
        The scheduler's ``prefix-spans``: tasks run under their prefix span, else
        under the dask span's own span
    """

    def __init__(self, prefix_spans: bool = True):
        self.prefix_spans = prefix_spans
        self._cache: OrderedDict[tuple[str, str], Context] = OrderedDict()
        self._log_once = OnceLogger(logger)

    def __len__(self) -> int:
        """How many contexts are remembered."""
        return len(self._cache)

    def context_of(self, span_id: str | None, prefix: str,
                   annotations: Mapping[str, Any] | None) -> Context | None:
        """The context of a task of dask span ``span_id`` (the span the scheduler
        put it in) and ``prefix``, from its annotations (``span``: the span's chain
        of ids; ``otel``: the W3C contexts its block carried); None for a task of
        no span."""
        if span_id is None:
            return None
        cache = self._cache
        key = (span_id, prefix)
        ctx = cache.get(key)
        if ctx is not None:
            return ctx
        try:
            ctx = self._derive(span_id, prefix, annotations or {})
        except Exception:
            self._log_once("derive", "cannot work out the OTel context of tasks of "
                           "span %s; they run without one (logged once)", span_id,
                           exc_info=True)
            return None
        cache[key] = ctx
        if len(cache) > MAX_CONTEXTS:
            cache.popitem(last=False)
        return ctx

    def _derive(self, span_id: str, prefix: str, annotations: Mapping[str, Any]
                ) -> Context:
        span_ann = annotations.get("span")
        ids: tuple[str, ...] = (span_id,)
        if isinstance(span_ann, Mapping):
            chain = tuple(span_ann.get("ids") or ())
            if chain and chain[-1] == span_id:
                ids = chain
        carried = parse_carried(annotations.get(names.ANNOTATION_KEY)) or {}
        chain_ids = resolve_chain(ids, carried)
        own = chain_ids.span_context
        if self.prefix_spans:
            own = SpanContext(
                own.trace_id, prefix_span_id(span_id, prefix), is_remote=True,
                trace_flags=own.trace_flags, trace_state=own.trace_state,
            )
        else:
            own = SpanContext(own.trace_id, own.span_id, is_remote=True,
                              trace_flags=own.trace_flags, trace_state=own.trace_state)
        return trace.set_span_in_context(NonRecordingSpan(own), Context())
