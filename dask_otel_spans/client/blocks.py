"""``span()``, a drop-in for ``distributed.span`` that carries the current OTel
context into the graph annotations and tells the scheduler when the block closes; and
what a bare submission (no block open) carries."""
from __future__ import annotations

import logging
import sys
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import dask
import distributed
import distributed.spans
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanContext

from dask_otel_spans import names
from dask_otel_spans.client.context import context_from_environment, injected
from dask_otel_spans.client.plugin_check import check_plugin_soon
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.propagation import (
    carrier_from_context,
    parse_carried,
    resolve_chain,
)

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)
_log_once = OnceLogger(logger)

#: Longest wait for the scheduler to acknowledge a close notice
NOTICE_TIMEOUT = 5.0

#: dask's own ``span``, which ``span()`` wraps (taken at import: the instrumentor
#: makes ``distributed.span`` this module's ``span`` while it is on)
_dask_span = distributed.spans.span

#: Close notices of asynchronous clients waiting for the next loop iteration: all
#: the blocks that closed in between go to the scheduler in one message
_BATCHES: weakref.WeakKeyDictionary[Client, list[dict[str, object]]] = (
    weakref.WeakKeyDictionary()
)


class _Block:
    """A ``span()`` block being run: its dask span and that span's reserved OTel span
    context (current inside the block), and whether it, or a block inside it, left
    lazy collections behind."""

    __slots__ = ("dask_id", "span_context", "lazy")

    def __init__(self, dask_id: str, span_context: SpanContext) -> None:
        self.dask_id = dask_id
        self.span_context = span_context
        self.lazy = False


#: the innermost open ``span()`` block of this thread or task
_CURRENT_BLOCK: ContextVar[_Block | None] = ContextVar(
    "dask_otel_spans_block", default=None
)


def _references(obj: object) -> int | None:
    """How many references ``obj`` has (None where the interpreter can't say)."""
    getrefcount = getattr(sys, "getrefcount", None)
    return getrefcount(obj) if getrefcount is not None else None


@contextmanager
def span(*tags: str) -> Iterator[str]:
    """Tag a group of tasks as a dask span, traced with OpenTelemetry.

    Same behaviour and yielded id as :func:`distributed.span` (nesting, "default"
    span), plus:

    - the OTel span current when the block is entered becomes the parent of the dask
      span's OTel span (carried to the scheduler in the ``otel`` graph annotation);
      with none current, the one the environment carriers ``TRACEPARENT``,
      ``TRACESTATE`` and ``BAGGAGE`` carry, if set (:func:`context_from_environment`);
    - inside the block, the dask span's own OTel span context is current, so that
      OTel spans created by client code (e.g. an instrumented HTTP call) land inside
      it, in the same trace;
    - when the block exits, the scheduler is told, so that the span is exported
      once, covering every ``compute()`` made inside the block. The notice says
      whether collections built in the block (delayed objects, arrays) still hold
      its annotation: a span the scheduler has not seen yet then waits for their
      graph (``otel-spans.lazy-timeout``) instead of ``idle-timeout``.

    Examples
    --------
    >>> with span("Alice's workflow", "data load") as span_id:  # doctest: +SKIP
    ...     df = dd.read_parquet(...).persist()
    """
    enter = time.time()
    client_ctx = otel_context.get_current()
    if not trace.get_current_span(client_ctx).get_span_context().is_valid:
        client_ctx = context_from_environment(client_ctx)
    outer = dask.get_annotations().get(names.ANNOTATION_KEY)
    carried_out: dict[str, object] = dict(outer) if isinstance(outer, Mapping) else {}

    parent_block = _CURRENT_BLOCK.get()
    with _dask_span(*tags) as dask_id:
        annotation = dask.get_annotations()["span"]
        ids = tuple(annotation["ids"])
        tags_chain = tuple(annotation["name"])
        opened = ids[len(ids) - len(tags) :]
        carried = dict(carried_out)
        for level, opened_id in enumerate(opened):
            # The first opened level hangs under the client's current span; further
            # levels of span("a", "b") hang under the previous level.
            carried[opened_id] = (
                _carrier_under(client_ctx, parent_block, ids[: -len(opened)])
                if level == 0 else {}
            )
        chain = resolve_chain(ids, parse_carried(carried) or {})
        own_ctx = trace.set_span_in_context(
            trace.NonRecordingSpan(chain.span_context), client_ctx
        )
        token = otel_context.attach(own_ctx)
        block = _Block(dask_id, chain.span_context)
        block_token = _CURRENT_BLOCK.set(block)
        # Collections built in the block copy the annotations, and so reference
        # ``carried``: more references after the block than before it means lazy
        # collections (computed later, or never) that will bring this span's tasks.
        block_annotations: dict[str, object] = {names.ANNOTATION_KEY: carried}
        if baggage.get_all(client_ctx):  # (the chain says the rest)
            block_annotations[names.CALLER_ANNOTATION_KEY] = injected(client_ctx)
        refs_before = _references(carried)
        try:
            with dask.annotate(**block_annotations):
                yield dask_id
        finally:
            refs_after = _references(carried)
            try:
                _CURRENT_BLOCK.reset(block_token)
            except ValueError:  # exited in another context than it was entered
                _CURRENT_BLOCK.set(parent_block)
            otel_context.detach(token)
            if refs_before is not None and refs_after is not None:
                block.lazy = block.lazy or refs_after > refs_before
            if block.lazy and parent_block is not None:
                parent_block.lazy = True  # an inner span's graph brings this one
            _notify_closed(
                {
                    "ids": list(ids),
                    "name": list(tags_chain),
                    "opened": len(opened),
                    "otel": carried,
                    "enter": enter,
                    "exit": time.time(),
                    "lazy": block.lazy,
                }
            )


def caller_carrier(ctx: otel_context.Context | None = None) -> dict[str, str] | None:
    """What a bare submission (no dask span block open) made in ``ctx`` (default:
    the current context) carries to the scheduler and the workers, in the
    ``otel-caller`` annotation: the context as the global propagator
    (``OTEL_PROPAGATORS``) injects it, with, when no span is current, what the
    environment carriers hold (:func:`context_from_environment`). None inside a
    ``span()`` or ``distributed.span`` block (the block carries its own context),
    and when there is nothing to carry.

    The instrumentor (:class:`~dask_otel_spans.instrumentation.DaskInstrumentor`)
    annotates every submission of a client with it.
    """
    if _CURRENT_BLOCK.get() is not None or "span" in dask.get_annotations():
        return None
    if ctx is None:
        ctx = otel_context.get_current()
    if not trace.get_current_span(ctx).get_span_context().is_valid:
        ctx = context_from_environment(ctx)
        if (not trace.get_current_span(ctx).get_span_context().is_valid
                and not baggage.get_all(ctx)):
            return None
    return injected(ctx) or None


def _carrier_under(
    client_ctx: otel_context.Context, parent_block: _Block | None, enclosing_ids: tuple[str, ...]
) -> dict[str, str]:
    """The W3C headers to carry for a block entered with ``client_ctx`` current,
    inside the dask spans ``enclosing_ids``: none (an empty carrier) when the current
    OTel span is the enclosing ``span()`` block's own reserved span, which the
    scheduler derives from the chain anyway (the parent dask span's OTel span, in the
    root's trace, with its flags and state); else the current span's headers.

    Most nested blocks are entered so: their chains then cross the graph, the close
    notice and the export pipe without a header to parse for their own level.
    """
    if (
        parent_block is not None
        and enclosing_ids
        and parent_block.dask_id == enclosing_ids[-1]
        and trace.get_current_span(client_ctx).get_span_context()
        == parent_block.span_context
    ):
        return {}
    return carrier_from_context(client_ctx)


def _notify_closed(msg: dict[str, object]) -> None:
    """Send the close notice through ``Client.log_event`` (never raises)."""
    try:
        client = distributed.default_client()
    except ValueError:
        _log_once(
            "no-client", "span() closed with no dask Client; the scheduler will close "
            "the span after its idle timeout instead"
        )
        return
    msg["client"] = client.id
    check_plugin_soon(client)
    try:
        if client.asynchronous:
            batch = _BATCHES.get(client)
            if batch is None:
                _BATCHES[client] = batch = []
                client.loop.add_callback(_send_batch, client)
            batch.append(msg)
        else:
            client.sync(
                client.scheduler.log_event,
                topic=names.EVENT_TOPIC,
                msg=msg,
                callback_timeout=NOTICE_TIMEOUT,
            )
    except Exception as e:
        _log_once(
            "notice-failed", "could not tell the scheduler that a span closed (%s); "
            "it will close after its idle timeout", e,
        )


async def _send_batch(client: Client) -> None:
    """Send the queued close notices of an asynchronous client as one event."""
    batch = _BATCHES.pop(client, None)
    if not batch:
        return
    try:
        assert client.scheduler is not None, "the client is closed"
        await client.scheduler.log_event(topic=names.EVENT_TOPIC, msg=batch)
    except Exception as e:
        _log_once(
            "notice-failed", "could not tell the scheduler that %d span(s) closed "
            "(%s); they will close after their idle timeout", len(batch), e,
        )
