"""Pure helpers: W3C trace context carried in graph annotations, and OTel ids derived
from dask span ids, so that the client and the scheduler compute the same ids."""
from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_MASK64 = (1 << 64) - 1
_PROPAGATOR = TraceContextTextMapPropagator()
#: W3C limits: traceparent is 55 characters, tracestate at most 32 members of 256
_MAX_CARRIER_VALUE = 512 * 32
#: Parsed carriers remembered: a span chain's contexts arrive once per graph
#: annotation and once per close notice, and ancestors' contexts in every chain below
_PARSED_CACHE_SIZE = 4096
#: Longest tracestate kept in that cache (bounds it to ~4 MiB; longer ones, rare and
#: possibly hostile, are parsed each time)
_MAX_CACHED_TRACESTATE = 1024
#: Ids worked out of dask span ids remembered (of the spans seen lately: a span's
#: ids are asked for while it runs and at its end; an older one's are worked out
#: again, in a few microseconds)
_IDS_CACHE_SIZE = 1024


#: masks of the variant bits within the low 64 bits of a UUID
_UUID_VARIANT_CLEAR = ~(0xC000 << 48) & _MASK64
_UUID_VARIANT_RFC4122 = 0x8000 << 48


def _id_bits(dask_id: str) -> int:
    """128 bits of a dask span id: its UUID, or a stable hash when it is no UUID."""
    if isinstance(dask_id, str):
        return _id_bits_of_str(dask_id)
    return _id_bits_uncached(dask_id)


@functools.lru_cache(maxsize=_IDS_CACHE_SIZE)
def _id_bits_of_str(dask_id: str) -> int:
    return _id_bits_uncached(dask_id)


def _id_bits_uncached(dask_id: str) -> int:
    try:
        return uuid.UUID(dask_id).int
    except (ValueError, TypeError, AttributeError):
        digest = hashlib.blake2b(str(dask_id).encode(), digest_size=16).digest()
        return int.from_bytes(digest, "big")


def otel_span_id(dask_span_id: str) -> int:
    """OTel span id of a dask span: the low 64 bits of its UUID (never 0)."""
    return (_id_bits(dask_span_id) & _MASK64) or 1


def otel_trace_id(dask_span_id: str) -> int:
    """OTel trace id of a chain without carried context: the root span's 128 bits."""
    return _id_bits(dask_span_id) or 1


@functools.lru_cache(maxsize=_IDS_CACHE_SIZE)
def prefix_span_id(dask_span_id: str, prefix: str) -> int:
    """Deterministic OTel span id of the child span of a task prefix: the low 64 bits
    of ``uuid5(<dask span id as a UUID>, prefix)``, computed without building UUIDs
    (remembered for the spans seen lately: the metrics' exemplars and the span's
    translation both ask)."""
    return _uuid5_low_bits(dask_span_id, str(prefix))


def task_span_id(dask_span_id: str, key: str) -> int:
    """Deterministic OTel span id of a task span: as :func:`prefix_span_id`, with
    ``"task/" + key`` (the task key as ``str``) in place of the prefix."""
    return _uuid5_low_bits(dask_span_id, "task/" + key)


def _uuid5_low_bits(dask_span_id: str, name: str) -> int:
    namespace = _id_bits(dask_span_id).to_bytes(16, "big")
    digest = hashlib.sha1(namespace + name.encode("utf-8")).digest()
    low = int.from_bytes(digest[8:16], "big")
    # the RFC 4122 variant bits, as uuid5 sets them
    return ((low & _UUID_VARIANT_CLEAR) | _UUID_VARIANT_RFC4122) or 1


def carrier_from_context(ctx: Context | None = None) -> dict[str, str]:
    """W3C headers of the span current in ``ctx``; empty when there is none."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=ctx)
    return carrier


def span_context_from_carrier(carrier: object) -> SpanContext | None:
    """The remote span context in a carried W3C carrier, or None.

    Anything malformed (not a mapping, wrong types, huge or invalid values) gives None;
    this never raises.
    """
    # (a plain dict first: most carriers are, and most are empty; the ABC check
    # costs more than the rest of an empty carrier's parse)
    if type(carrier) is not dict and not isinstance(carrier, Mapping):
        return None
    if not carrier:
        return None
    traceparent = carrier.get("traceparent")
    # (a plain str inline: the check runs for every level of every chain)
    if not (type(traceparent) is str and len(traceparent) <= _MAX_CARRIER_VALUE
            or _is_carrier_value(traceparent)):
        return None
    tracestate = carrier.get("tracestate")
    if tracestate is None:
        return _parse_w3c(traceparent, None)
    if not _is_carrier_value(tracestate):
        tracestate = None
    elif len(tracestate) > _MAX_CACHED_TRACESTATE:
        return _parse_w3c.__wrapped__(traceparent, tracestate)
    return _parse_w3c(traceparent, tracestate)


def _is_carrier_value(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= _MAX_CARRIER_VALUE


@functools.lru_cache(maxsize=_PARSED_CACHE_SIZE)
def _parse_w3c(traceparent: str, tracestate: str | None) -> SpanContext | None:
    """The span context of W3C headers (immutable, so shared by every caller)."""
    carrier = {"traceparent": traceparent}
    if tracestate is not None:
        carrier["tracestate"] = tracestate
    try:
        ctx = _PROPAGATOR.extract(carrier)
    except Exception:  # pragma: no cover - the propagator validates itself
        return None
    sc = trace.get_current_span(ctx).get_span_context()
    return sc if sc.is_valid else None


def parse_carried(
    annotation: object, parsed: dict[int, SpanContext | None] | None = None
) -> dict[str, SpanContext | None] | None:
    """Parse an ``otel`` annotation ``{dask span id: carrier}``.

    Returns ``{dask span id: span context or None}`` for the well-formed keys, None
    when the annotation is not a mapping at all. An entry with an empty or invalid
    carrier maps to None: the span was opened by the client helper, with no OTel
    context current.

    ``parsed``, when given, maps ``id(carrier)`` to its context for carriers parsed
    by earlier calls; the caller keeps those carriers alive while it uses it (e.g.
    the chains of one graph's annotation, which share their ancestors' carriers).
    """
    if type(annotation) is not dict and not isinstance(annotation, Mapping):
        return None
    out: dict[str, SpanContext | None] = {}
    for dask_id, carrier in annotation.items():
        if isinstance(dask_id, str) and dask_id:
            if parsed is None:
                out[dask_id] = span_context_from_carrier(carrier)
                continue
            key = id(carrier)
            try:
                out[dask_id] = parsed[key]
            except KeyError:
                out[dask_id] = parsed[key] = span_context_from_carrier(carrier)
    return out


def carried_headers(annotation: object) -> dict[str, object] | None:
    """An ``otel`` annotation ``{dask span id: W3C headers}`` as the scheduler keeps
    it: the headers as the client sent them, unparsed (they are parsed where the
    span is translated, :func:`parse_carried`: off the scheduler's event loop);
    None when it is not a mapping at all, or one that fails to be read (a client's
    own class). A plain dict is returned as is, not copied: callers only read it."""
    if type(annotation) is dict:
        return annotation
    if isinstance(annotation, Mapping):
        try:
            return dict(annotation)
        except Exception:
            return None
    return None


def w3c_headers(carrier: object) -> dict[str, str] | None:
    """The ``traceparent`` (and ``tracestate``) of a carrier as a new dict of
    strings of at most W3C's size, or None when it has no such ``traceparent``:
    what may cross to another process of whatever a client carried (a mapping that
    fails to be read has none)."""
    if type(carrier) is not dict and not isinstance(carrier, Mapping):
        return None
    try:
        traceparent = carrier.get("traceparent")
        if not _is_carrier_value(traceparent):
            return None
        tracestate = carrier.get("tracestate")
    except Exception:  # (a client's own Mapping class)
        return None
    if _is_carrier_value(tracestate):
        return {"traceparent": traceparent, "tracestate": tracestate}
    return {"traceparent": traceparent}


@dataclass(frozen=True)
class ChainIds:
    """OTel identity of the last dask span of a chain of ids."""

    trace_id: int
    span_id: int
    #: None for the root of a trace
    parent_span_id: int | None
    trace_flags: TraceFlags
    trace_state: TraceState | None
    #: the context carried for the span that is not its parent, being of another
    #: trace than the root's: the span links to it (None when there is none)
    link: SpanContext | None = None

    @property
    def parent_context(self) -> SpanContext | None:
        if self.parent_span_id is None:
            return None
        return SpanContext(
            trace_id=self.trace_id,
            span_id=self.parent_span_id,
            is_remote=True,
            trace_flags=self.trace_flags,
            trace_state=self.trace_state,
        )

    @property
    def span_context(self) -> SpanContext:
        """The (reserved) OTel span context of the dask span itself."""
        return SpanContext(
            trace_id=self.trace_id,
            span_id=self.span_id,
            is_remote=False,
            trace_flags=self.trace_flags,
            trace_state=self.trace_state,
        )


def resolve_chain(
    ids: Sequence[str], carried: Mapping[str, SpanContext | None]
) -> ChainIds:
    """OTel ids of ``ids[-1]``, the last span of a dask span chain root-first: the
    one rule every process applies (docs/data-contract.md, "Identifiers").

    - trace id: the one carried for the root when there is one, else the root's UUID
      (every span of the tree is in the root's trace);
    - parent: the span carried for ``ids[-1]`` when it belongs to that trace, else the
      parent dask span's OTel span, else none (a root); a span carried for
      ``ids[-1]`` in another trace is its ``link``, never its parent;
    - flags and state: the root's carried ones, else sampled.
    """
    if not ids:
        raise ValueError("empty span chain")
    root_ctx = carried.get(ids[0])
    if root_ctx is not None:
        trace_id = root_ctx.trace_id
        flags = root_ctx.trace_flags
        state = root_ctx.trace_state
    else:
        trace_id = otel_trace_id(ids[0])
        flags = TraceFlags(TraceFlags.SAMPLED)
        state = None
    own_ctx = carried.get(ids[-1]) if len(ids) > 1 else None
    link = None
    if own_ctx is not None and own_ctx.trace_id == trace_id:
        parent: int | None = own_ctx.span_id
    elif len(ids) > 1:
        parent = otel_span_id(ids[-2])
        link = own_ctx
    else:
        parent = root_ctx.span_id if root_ctx is not None else None
    return ChainIds(
        trace_id=trace_id,
        span_id=otel_span_id(ids[-1]),
        parent_span_id=parent,
        trace_flags=flags,
        trace_state=state,
        link=link,
    )
