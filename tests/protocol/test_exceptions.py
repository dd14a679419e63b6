"""Exception class names as the conventions write them: from the class, or read from
the head of the exception's pickle, the same as the SDK's ``record_exception``."""
from __future__ import annotations

import json
import pickle

import pytest
from distributed.protocol.serialize import Serialize, Serialized, serialize
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support.failures import Outer

from dask_otel_spans.protocol.exceptions import (
    PICKLE_HEAD,
    class_in_pickle,
    exception_class,
    exception_type,
)

EXCEPTIONS = [ValueError("boom"), KeyError("k"),
              json.JSONDecodeError("Expecting value", "{", 1), Outer.BadRecord("r")]


def recorded_type(exception: BaseException) -> str:
    """``exception.type`` as the OpenTelemetry SDK's ``record_exception`` writes it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("s") as span:
        span.record_exception(exception)
    (event,) = exporter.get_finished_spans()[0].events
    return event.attributes["exception.type"]


def as_a_worker_sends_it(exception: BaseException) -> Serialized:
    return Serialized(*serialize(exception, serializers=("pickle",)))


def bare(exception: BaseException) -> str:
    return repr(exception).partition("(")[0]


@pytest.mark.parametrize("exception", EXCEPTIONS, ids=lambda e: type(e).__name__)
def test_the_type_read_from_the_pickle_is_the_sdks(exception):
    origin = exception_class(as_a_worker_sends_it(exception))
    assert isinstance(origin, bytes) and len(origin) <= PICKLE_HEAD
    assert exception_type(bare(exception), origin) == recorded_type(exception)


@pytest.mark.parametrize("exception", EXCEPTIONS, ids=lambda e: type(e).__name__)
def test_the_type_of_an_exception_at_hand_is_the_sdks(exception):
    assert exception_type(bare(exception), exception_class(Serialize(exception))) \
        == recorded_type(exception)


def test_a_pickle_of_protocol_2_names_its_class_too():
    head = pickle.dumps(json.JSONDecodeError("m", "d", 0), protocol=2)[:PICKLE_HEAD]
    assert class_in_pickle(head) == "json.decoder.JSONDecodeError"


@pytest.mark.parametrize("head", [b"", b"not a pickle", pickle.dumps(1), b"\x80\x05\x95"])
def test_what_names_no_class_gives_none(head):
    assert class_in_pickle(head) is None


def test_a_class_that_does_not_match_the_repr_is_not_trusted():
    origin = exception_class(as_a_worker_sends_it(ValueError("x")))
    assert exception_type("KeyError", origin) == "KeyError"


def test_without_an_origin_the_name_of_the_repr_stays():
    assert exception_type("BadRecord", None) == "BadRecord"
    assert exception_type("", None) == "Exception"


def test_an_unreadable_repr_takes_the_class_the_pickle_names():
    """(``exception_parts`` gives ``Exception`` for a ``repr`` it cannot read)"""
    origin = exception_class(as_a_worker_sends_it(Outer.BadRecord("r")))
    assert exception_type("Exception", origin) == "support.failures.Outer.BadRecord"
