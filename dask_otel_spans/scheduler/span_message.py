"""The ``span_added`` message of a span of the scheduler's extension (what the
forwarder sends for a new span, and for an adopted one)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from dask_otel_spans.protocol import events
from dask_otel_spans.protocol.dask_private import nthreads_offset
from dask_otel_spans.protocol.events import Message

if TYPE_CHECKING:
    from distributed.spans import Span


def chain_ids(span: Span) -> tuple[str, ...]:
    """The ids of ``span`` and its ancestors, root first."""
    ids = []
    node: Span | None = span
    while node is not None:
        ids.append(node.id)
        node = node.parent
    return tuple(reversed(ids))


def span_message(span: Span, position: int) -> Message:
    """The message of a span at ``position`` in the extension's dict."""
    return events.span_added(chain_ids(span), tuple(span.name), span.enqueued,
                             nthreads_offset(span), position)

