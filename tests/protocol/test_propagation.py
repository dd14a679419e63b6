"""Pure tests of id derivation and W3C context carry/extract."""
from __future__ import annotations

import uuid
from collections.abc import Mapping

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanContext, TraceFlags

from dask_otel_spans.protocol.propagation import (
    carrier_from_context,
    otel_span_id,
    otel_trace_id,
    parse_carried,
    prefix_span_id,
    resolve_chain,
    span_context_from_carrier,
)


def carrier_for(span_context: SpanContext) -> dict[str, str]:
    """W3C headers for an explicit span context."""
    return carrier_from_context(
        trace.set_span_in_context(trace.NonRecordingSpan(span_context)))


ROOT = "9cd7531a-e510-4f61-837a-ca1e4437bd90"
CHILD = "0eadd631-e68b-495e-b072-7765d0d61002"
APP = SpanContext(
    trace_id=0x0AF7651916CD43DD8448EB211C80319C,
    span_id=0xB7AD6B7169203331,
    is_remote=True,
    trace_flags=TraceFlags(TraceFlags.SAMPLED),
)


def test_span_id_is_low_64_bits_of_uuid():
    assert otel_span_id(CHILD) == uuid.UUID(CHILD).int & (2**64 - 1)
    assert otel_span_id(CHILD) == 0xB0727765D0D61002


def test_trace_id_is_128_bits_of_uuid():
    assert otel_trace_id(ROOT) == uuid.UUID(ROOT).int


def test_non_uuid_ids_hash_stably_and_never_zero():
    assert otel_span_id("not-a-uuid") == otel_span_id("not-a-uuid")
    assert otel_span_id("not-a-uuid") != otel_span_id("other")
    assert otel_span_id("00000000-0000-0000-0000-000000000000") == 1


@pytest.mark.parametrize(
    "dask_id", [ROOT, str(uuid.UUID(int=1)), "not-a-uuid", "spaces and ünïcode"]
)
@pytest.mark.parametrize("prefix", ["sum", "read-parquet", "", "ünï", "x" * 300])
def test_prefix_span_id_is_the_low_64_bits_of_uuid5(dask_id, prefix):
    # the id scheme is part of the data contract: it must not drift with the code
    namespace = uuid.UUID(int=otel_trace_id(dask_id))  # (the id's 128 bits)
    expected = (uuid.uuid5(namespace, prefix).int & ((1 << 64) - 1)) or 1
    assert prefix_span_id(dask_id, prefix) == expected


def test_prefix_span_ids_are_deterministic_and_distinct():
    a = prefix_span_id(ROOT, "sum")
    assert a == prefix_span_id(ROOT, "sum")
    assert a != prefix_span_id(ROOT, "sum-partial")
    assert a != prefix_span_id(CHILD, "sum")


def test_carrier_round_trip():
    carrier = carrier_for(APP)
    assert carrier["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
    sc = span_context_from_carrier(carrier)
    assert (sc.trace_id, sc.span_id, sc.trace_flags) == (
        APP.trace_id,
        APP.span_id,
        APP.trace_flags,
    )


def test_carrier_from_context_without_span_is_empty():
    assert carrier_from_context() == {}


def test_carrier_from_current_sdk_span():
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("x") as s:
        carrier = carrier_from_context()
    assert span_context_from_carrier(carrier).span_id == s.get_span_context().span_id


@pytest.mark.parametrize(
    "carrier",
    [
        None,
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920"},
        {"traceparent": "00-00000000000000000000000000000000-b7ad6b7169203331-01"},
        {"traceparent": 42},
        {"traceparent": "x" * 100_000},
        {},
        [("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")],
    ],
)
def test_malformed_carriers_give_none(carrier):
    assert span_context_from_carrier(carrier) is None


def test_parse_carried_keeps_helper_entries_without_context():
    parsed = parse_carried({ROOT: {}, CHILD: carrier_for(APP), 7: {}, "": {}})
    assert parsed == {ROOT: None, CHILD: span_context_from_carrier(carrier_for(APP))}
    assert parse_carried("garbage") is None


def test_parse_carried_parses_a_carrier_shared_by_chains_once(monkeypatch):
    from dask_otel_spans.protocol import propagation

    calls = []
    parse_one = propagation.span_context_from_carrier
    monkeypatch.setattr(propagation, "span_context_from_carrier",
                        lambda carrier: calls.append(carrier) or parse_one(carrier))
    root_carrier = carrier_for(APP)
    # two chains of one annotation below the same root share its carrier object
    chains = [{ROOT: root_carrier, CHILD: {}}, {ROOT: root_carrier, "other": {}}]
    parsed: dict = {}
    results = [parse_carried(chain, parsed) for chain in chains]
    assert [r[ROOT] for r in results] == [parse_one(root_carrier)] * 2
    assert results[0][CHILD] is None and results[1]["other"] is None
    assert sum(c is root_carrier for c in calls) == 1
    assert len(calls) == 3


def test_str_subclass_header_values_are_parsed():
    class Header(str):
        pass

    carrier = {k: Header(v) for k, v in carrier_for(APP).items()}
    assert span_context_from_carrier(carrier).span_id == APP.span_id


def test_root_without_carried_context_uses_root_uuid():
    ids = resolve_chain([ROOT], {})
    assert ids.trace_id == otel_trace_id(ROOT)
    assert ids.span_id == otel_span_id(ROOT)
    assert ids.parent_span_id is None
    assert ids.trace_flags.sampled


def test_root_with_carried_context_joins_client_trace():
    ids = resolve_chain([ROOT], {ROOT: APP})
    assert ids.trace_id == APP.trace_id
    assert ids.parent_span_id == APP.span_id


def test_child_without_carried_context_hangs_under_parent_dask_span():
    ids = resolve_chain([ROOT, CHILD], {ROOT: APP})
    assert ids.trace_id == APP.trace_id
    assert ids.parent_span_id == otel_span_id(ROOT)


def test_child_with_carried_context_of_same_trace_uses_it():
    client_span = SpanContext(APP.trace_id, 0x1234, True, APP.trace_flags)
    ids = resolve_chain([ROOT, CHILD], {ROOT: APP, CHILD: client_span})
    assert ids.parent_span_id == 0x1234


def test_child_carried_context_of_other_trace_is_its_link_not_its_parent():
    ids = resolve_chain([ROOT, CHILD], {ROOT: None, CHILD: APP})
    assert ids.trace_id == otel_trace_id(ROOT)
    assert ids.parent_span_id == otel_span_id(ROOT)
    assert ids.link == APP


def test_a_carried_context_used_as_the_parent_is_no_link():
    assert resolve_chain([ROOT], {ROOT: APP}).link is None
    same_trace = SpanContext(APP.trace_id, 0x1234, True, APP.trace_flags)
    assert resolve_chain([ROOT, CHILD], {ROOT: APP, CHILD: same_trace}).link is None


def test_unsampled_client_context_is_kept():
    unsampled = SpanContext(APP.trace_id, APP.span_id, True, TraceFlags(0))
    assert not resolve_chain([ROOT], {ROOT: unsampled}).trace_flags.sampled


def test_reserved_span_context_is_valid_and_local():
    sc = resolve_chain([ROOT, CHILD], {}).span_context
    assert sc.is_valid and not sc.is_remote
    assert trace.NonRecordingSpan(sc).get_span_context().span_id == otel_span_id(CHILD)


def test_long_tracestates_are_parsed():
    ctx = SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=True,
                      trace_flags=TraceFlags(1))
    carrier = carrier_for(ctx)
    carrier["tracestate"] = ",".join(f"k{i}=" + "v" * 200 for i in range(30))
    for _ in range(2):  # (parsed anew each time: too long for the parse cache)
        parsed = span_context_from_carrier(carrier)
        assert (parsed.trace_id, parsed.span_id) == (0xABC, 0xDEF)


def test_carried_headers_are_kept_as_sent_and_no_mapping_is_refused():
    from types import MappingProxyType

    from dask_otel_spans.protocol.propagation import carried_headers

    annotation = {"a": {"traceparent": "anything"}, "b": {}}
    assert carried_headers(annotation) is annotation  # (not parsed, not copied)
    assert carried_headers(MappingProxyType(annotation)) == annotation
    assert carried_headers(["a", "b"]) is None
    assert carried_headers(None) is None


class UnreadableMapping(Mapping):
    """A client's own mapping class that fails whenever it is read."""

    def __getitem__(self, key):
        raise RuntimeError("unreadable")

    def __iter__(self):
        raise RuntimeError("unreadable")

    def __len__(self):
        raise RuntimeError("unreadable")


def test_a_mapping_that_fails_to_be_read_carries_nothing_and_raises_nothing():
    """On the event loop (an annotation) and on the sender (a carrier), a client's
    mapping that raises when read is taken as no mapping: never an exception."""
    from dask_otel_spans.protocol.propagation import carried_headers, w3c_headers

    assert carried_headers(UnreadableMapping()) is None
    assert w3c_headers(UnreadableMapping()) is None
