"""The OTel context a task runs in on a worker: the span context of its prefix span
inside its dask span (the dask span's own without prefix spans), exactly as the
scheduler exports it; for a bare submission's task, its caller's span. With the
caller's baggage. Worked out once per dask span, prefix and caller (bounded cache).
And what graphs submitted by task code carry: the task's span tree's contexts."""
from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import TypeAlias

from opentelemetry import baggage, propagate, trace
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

#: Contexts remembered (one per dask span and prefix that ran lately on this worker;
#: one of an older span is worked out again when its task comes)
MAX_CONTEXTS = 1024

#: A caller carrier's items, sorted: its part of a context's cache key
CallerKey: TypeAlias = tuple[tuple[str, str], ...]


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
        self._cache: OrderedDict[tuple[str, str, CallerKey], Context] = OrderedDict()
        self._log_once = OnceLogger(logger)

    def __len__(self) -> int:
        """How many contexts are remembered."""
        return len(self._cache)

    def context_of(self, span_id: str | None, prefix: str,
                   annotations: Mapping[str, object] | None) -> Context | None:
        """The context of a task of dask span ``span_id`` (the span the scheduler
        put it in) and ``prefix``, from its annotations (``span``: the span's chain
        of ids; ``otel``: the W3C contexts its block carried; ``otel-caller``: the
        context of the caller that submitted it, as the client's propagators
        injected it); None for a task of no span.

        A task of a bare submission (an ``otel-caller`` and no ``otel`` chain) runs
        in its caller's span: spans made in its code are children of the caller's
        span, in the caller's trace. Every task gets its caller's baggage, as this
        worker's propagators (``OTEL_PROPAGATORS``) extract it.
        """
        if span_id is None:
            return None
        caller = annotations.get(names.CALLER_ANNOTATION_KEY) if annotations else None
        caller_key = _caller_key(caller) if caller is not None else ()
        cache = self._cache
        key = (span_id, prefix, caller_key) if caller_key is not None else None
        ctx = cache.get(key) if key is not None else None
        if ctx is not None:
            return ctx
        annotations = annotations or {}
        try:
            ctx = self._derive(span_id, prefix, annotations)
            if caller is not None:
                ctx = _with_caller(ctx, caller, names.ANNOTATION_KEY in annotations)
        except Exception:
            self._log_once("derive", "cannot work out the OTel context of tasks of "
                           "span %s; they run without one (logged once)", span_id,
                           exc_info=True)
            return None
        if key is None:
            return ctx  # (a carrier too large to remember)
        cache[key] = ctx
        if len(cache) > MAX_CONTEXTS:
            cache.popitem(last=False)
        return ctx

    def _derive(self, span_id: str, prefix: str, annotations: Mapping[str, object]
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


#: Longest caller carrier (all keys and values) remembered in the cache
_MAX_CACHED_CARRIER = 8192


def _caller_key(caller: object) -> CallerKey | None:
    """The cache key part of a task's caller carrier: its items; None when it is no
    mapping of strings of bounded size (worked out each time, never remembered)."""
    if not isinstance(caller, Mapping):
        return ()  # (ignored: a malformed carrier says nothing)
    try:
        items = tuple(sorted(caller.items()))
    except Exception:
        return None
    size = 0
    for name, value in items:
        if type(name) is not str or type(value) is not str:
            return None
        size += len(name) + len(value)
    return items if size <= _MAX_CACHED_CARRIER else None


def _with_caller(ctx: Context, caller: object, in_block: bool) -> Context:
    """``ctx`` with what the caller's carrier holds: its baggage, and, for a bare
    submission (not ``in_block``), its span in place of the task's own."""
    if not isinstance(caller, Mapping):
        return ctx
    try:
        carrier = {name: value for name, value in caller.items()
                   if type(name) is str and type(value) is str}
        extracted = propagate.extract(carrier, context=Context())
    except Exception:  # (a propagator's own failure: the task's own context)
        return ctx
    caller_span = trace.get_current_span(extracted)
    if not in_block and caller_span.get_span_context().is_valid:
        ctx = trace.set_span_in_context(caller_span, ctx)
    for name, value in baggage.get_all(extracted).items():
        ctx = baggage.set_baggage(name, value, ctx)
    return ctx


def carried_by_submissions(annotations: Mapping[str, object] | None
                           ) -> dict[str, object] | None:
    """The annotations that graphs submitted by a task's code carry (through
    ``worker_client`` or ``get_client``) beside the ``span`` one distributed
    propagates: the task's ``otel`` annotation, the contexts its span tree's blocks
    carried, root first. With it, a span a task opens below the task's own (plain
    ``distributed.span`` or ``span()``) and the tasks it submits are in the trace
    of the tree's root, whichever worker runs them (without it, they only know the
    root's dask id). None for a task of no span, or one whose ``otel``
    annotation is missing, empty or no dict (a malformed one is not passed on)."""
    if not annotations or "span" not in annotations:
        return None
    chain = annotations.get(names.ANNOTATION_KEY)
    if type(chain) is not dict or not chain:
        return None
    return {names.ANNOTATION_KEY: chain}
