"""Adoption: the spans that exist already (at start, or for a new export process)
forwarded to the export side, with their groups, metrics and carried contexts."""
from __future__ import annotations

from collections.abc import Collection, Container, Iterator
from itertools import islice
from typing import TYPE_CHECKING

from dask_otel_spans import names
from dask_otel_spans.protocol import events
from dask_otel_spans.protocol.dask_facts import group_done
from dask_otel_spans.protocol.dask_private import cumulative_metrics
from dask_otel_spans.protocol.events import Message
from dask_otel_spans.protocol.snapshots import done_figures
from dask_otel_spans.scheduler.counts import Entry, note_counts
from dask_otel_spans.scheduler.span_message import span_message

if TYPE_CHECKING:
    from distributed.spans import Span

    from dask_otel_spans.scheduler.forwarder import SpanForwarder


def adopt_spans(forwarder: SpanForwarder, handed_over: Container[int] | None,
                step: int) -> Iterator[None]:
    """Forward the spans that exist already and still run (a task group not
    done), with their ancestors, task groups and metrics so far: at start, and
    for a new export process. Pauses (yields) every ``step`` spans;
    spans created meanwhile are forwarded by the ticks.

    ``handed_over``: for a new export process, the places of the spans the ones
    before it said they handed over (an export process says them before it does:
    :class:`~dask_otel_spans.protocol.wire.HandedOver`); the done spans forwarded
    before and not there are forwarded again (what went to a process that died,
    and it had not handed over, is lost with it), and none of those there: no
    span is made twice.
    """
    upto = forwarder.forwarded.n_known
    forwarder.forwarded.for_a_new_copy()  # (the next tick tells it the workers)
    first = forwarder.forwarded.first
    places: dict[str, int] = {}  # span id -> place, of the spans looked at
    sent: set[str] = set()
    out: list[Message] = []
    for i, span in enumerate(islice(list(forwarder.spans.values()), upto)):
        if i and i % step == 0:
            if out:
                forwarder.sink.send(out)
                out = []
            yield
        places[span.id] = i
        if span.id in sent:
            continue
        if all(group_done(tg) for tg in list(span.groups)):
            if handed_over is not None and i >= first and i not in handed_over:
                # (alone: its done ancestors were in the dead process's hands)
                sent.add(span.id)
                _adopted(forwarder, span, i, out)
            continue
        chain = []
        node: Span | None = span
        while node is not None and node.id not in sent:
            chain.append(node)
            node = node.parent
        for node in reversed(chain):
            # (an ancestor comes first in the dict: its place is known)
            sent.add(node.id)
            _adopted(forwarder, node, places.get(node.id, -1), out)
    if out:
        forwarder.sink.send(out)
    yield from _carried_again(forwarder, sent, step)


def _carried_again(forwarder: SpanForwarder, adopted: Collection[str],
                   step: int) -> Iterator[None]:
    """Forward again the contexts the client helper's blocks carried for the
    adopted spans (the ``otel`` chains of the tasks the scheduler still holds): a
    new export process gives the spans of a tree the ids the one before gave
    them (the root's trace). Reads the tasks in steps."""
    chains: dict[int, object] = {}
    if not adopted:
        return
    for i, ts in enumerate(list(forwarder.tasks.values()), 1):
        if i % step == 0:
            yield
        annotations = ts.annotations
        chain = annotations.get(names.ANNOTATION_KEY) if annotations else None
        if type(chain) is dict and id(chain) not in chains and any(
                dask_id in adopted for dask_id in chain):
            chains[id(chain)] = chain
    if chains:
        forwarder.sink.send([events.carried_again(list(chains.values()))])


def _adopted(forwarder: SpanForwarder, span: Span, position: int,
             out: list[Message]) -> None:
    """The messages of an adopted span: itself, its groups, its metrics."""
    out.append(span_message(span, position))
    forwarder.forwarded.spans += 1
    counts: list[Entry] = []
    for tg in list(span.groups):
        if group_done(tg):
            out.append(events.group_done(
                span.id, id(tg),
                done_figures(tg, forwarder.sampler.take_erred_window(tg))))
        else:  # (the ticks need not send it again)
            out.append(events.group_running(span.id, id(tg), str(tg.prefix.name)))
            note_counts(forwarder.forwarded.running, tg, counts)
    if counts:
        out.append(events.group_counts(counts))
    metrics = cumulative_metrics(span)
    if metrics:
        out.append(events.span_metrics(span.id, dict(metrics)))
    if forwarder.include_code:
        forwarder.code_messages([span.id], out)
