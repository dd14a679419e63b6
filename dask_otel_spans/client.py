"""Client side: ``span()``, a drop-in for ``distributed.span`` that carries the current
OTel context into the graph annotations and tells the scheduler when the block closes."""
from __future__ import annotations

import logging
import os
import sys
import time
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import dask
import distributed
import distributed.spans
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanContext

from dask_otel_spans import names
from dask_otel_spans.protocol.propagation import (
    carrier_from_context,
    parse_carried,
    resolve_chain,
)

if TYPE_CHECKING:
    from dask_otel_spans.state import ExportState

logger = logging.getLogger(__name__)
_warned: set[str] = set()

#: Longest wait for the scheduler to acknowledge a close notice
NOTICE_TIMEOUT = 5.0

#: dask's own ``span``, which ``span()`` wraps (taken at import: the instrumentor
#: makes ``distributed.span`` this module's ``span`` while it is on)
_dask_span = distributed.spans.span

#: The OTel specification's environment carriers: variable -> carrier key. With no
#: current span, ``span()`` takes its parent context from them
ENVIRONMENT_CARRIERS = {
    "TRACEPARENT": "traceparent",
    "TRACESTATE": "tracestate",
    "BAGGAGE": "baggage",
}

#: How to give a scheduler the plugin (in the WARNING and in :class:`PluginMissing`)
PLUGIN_FIX = (
    "start it with `dask scheduler --preload dask_otel_spans`, set "
    "distributed.scheduler.preload: [dask_otel_spans] in the scheduler's dask config "
    "(DASK_DISTRIBUTED__SCHEDULER__PRELOAD='[\"dask_otel_spans\"]'), or call "
    "client.register_plugin(OTelSpansPlugin())"
)

#: (client id, scheduler address) of the clients whose scheduler was asked whether
#: it runs the plugin
_PLUGIN_CHECKED: set[tuple[str, str]] = set()

#: Close notices of asynchronous clients waiting for the next loop iteration: all
#: the blocks that closed in between go to the scheduler in one message
_BATCHES: weakref.WeakKeyDictionary[Any, list[dict[str, Any]]] = (
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


def _warn_once(kind: str, msg: str, *args: Any) -> None:
    if kind not in _warned:
        _warned.add(kind)
        logger.warning("dask_otel_spans: " + msg, *args)


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
    carried_out: dict[str, Any] = dict(outer) if isinstance(outer, Mapping) else {}

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
        block_annotations: dict[str, Any] = {names.ANNOTATION_KEY: carried}
        if baggage.get_all(client_ctx):  # (the chain says the rest)
            block_annotations[names.CALLER_ANNOTATION_KEY] = _inject(client_ctx)
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
    return _inject(ctx) or None


def _inject(ctx: otel_context.Context) -> dict[str, str]:
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
        _warn_once(
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


def _carrier_under(
    client_ctx: Any, parent_block: _Block | None, enclosing_ids: tuple[str, ...]
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


def _notify_closed(msg: dict[str, Any]) -> None:
    """Send the close notice through ``Client.log_event`` (never raises)."""
    try:
        client = distributed.default_client()
    except ValueError:
        _warn_once(
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
        _warn_once(
            "notice-failed", "could not tell the scheduler that a span closed (%s); "
            "it will close after its idle timeout", e,
        )


async def _send_batch(client: Any) -> None:
    """Send the queued close notices of an asynchronous client as one event."""
    batch = _BATCHES.pop(client, None)
    if not batch:
        return
    try:
        await client.scheduler.log_event(topic=names.EVENT_TOPIC, msg=batch)
    except Exception as e:
        _warn_once(
            "notice-failed", "could not tell the scheduler that %d span(s) closed "
            "(%s); they will close after their idle timeout", len(batch), e,
        )


def check_plugin_soon(client: Any) -> None:
    """Once per client and scheduler address, ask that scheduler in the background
    whether it runs the plugin (the metadata a running plugin sets); when it does
    not, one WARNING naming the fix. Adds no wait to the caller and never raises."""
    try:
        key = (str(client.id), str(client.scheduler.address))
        if key in _PLUGIN_CHECKED:
            return
        _PLUGIN_CHECKED.add(key)
        client.loop.add_callback(_check_plugin, client, key[1])
    except Exception as e:  # (a closed client, a client without a loop)
        logger.debug("dask_otel_spans: cannot check the scheduler for the plugin: %s", e)


async def plugin_running(client: Any) -> bool:
    """Whether the scheduler of the asynchronous ``client`` (or of a client whose
    loop this runs on) runs the plugin: the metadata a running plugin sets, asked
    for in one message, no code run on the scheduler."""
    version = await client.scheduler.get_metadata(
        keys=list(names.PLUGIN_METADATA_KEYS), default=None)
    return bool(version)


async def _check_plugin(client: Any, address: str) -> None:
    try:
        running = await plugin_running(client)
    except Exception as e:  # (the scheduler went away: nothing to say about it)
        logger.debug("dask_otel_spans: cannot ask %s for the plugin: %s", address, e)
        return
    if not running:
        logger.warning(
            "dask_otel_spans: the scheduler at %s runs no dask_otel_spans plugin, so "
            "this client's spans are not exported: %s", address, PLUGIN_FIX)


class PluginMissing(RuntimeError):
    """The scheduler has no ``OTelSpansPlugin``."""


def wait_for_export(client: Any, timeout: float = 30.0) -> ExportState:
    """Wait until the scheduler's plugin handed over every span (none open), then
    flush its exporters; where data went and how far export got.

    Spans are exported once done, closed and past a short grace period: call this
    before closing a short-lived cluster to see them exported as finished, not as
    incomplete at shutdown. Gives up after ``timeout`` seconds, returning the state
    then (``open`` tells what is left).

    Returns
    -------
    :class:`~dask_otel_spans.state.ExportState`: ``flushed`` is False when the
    exporters did not finish or their last export failed (a collector that is
    down: ``held`` and ``spooled`` count what waits to be sent again).

    Raises
    ------
    PluginMissing
        When the scheduler has no plugin (started without ``--preload
        dask_otel_spans``).
    """
    from dask_otel_spans.state import scheduler_state

    deadline = time.monotonic() + timeout
    # (each call forwards what happened so far and reads fresh figures: an export
    # process reports its own twice a second otherwise)
    state = client.run_on_scheduler(scheduler_state, flush=True)
    while state is not None and state.open and time.monotonic() < deadline:
        time.sleep(0.1)
        state = client.run_on_scheduler(scheduler_state, flush=True)
    if state is None:
        raise PluginMissing(
            f"the scheduler at {client.scheduler.address} has no dask_otel_spans "
            f"plugin: {PLUGIN_FIX}"
        )
    return state
