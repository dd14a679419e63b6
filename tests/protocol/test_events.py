"""The protocol's dispatch: every message, built by its constructor, calls its
handler with its fields; what is not of the protocol is refused by name, never
half-applied."""
from __future__ import annotations

import inspect

import pytest
from support.stand_ins import Recorder

from dask_otel_spans.export.session import ExportSession
from dask_otel_spans.protocol import events


def test_a_message_calls_its_handler_with_its_fields():
    recorder = Recorder()
    events.Dispatcher(recorder)(events.client_gone(5.0, "client-1"))
    assert recorder.calls == [("on_client_gone", (5.0, "client-1"))]


@pytest.mark.parametrize("message", [("bogus", 1), (), None, ("client-gone", 5.0)],
                         ids=["unknown kind", "empty", "not a tuple", "a field short"])
def test_a_message_not_of_the_protocol_is_refused(message):
    recorder = Recorder()
    with pytest.raises(events.UnknownMessage):
        events.Dispatcher(recorder)(message)
    assert recorder.calls == []


CONSTRUCTORS = [value for name, value in vars(events).items()
                if inspect.isfunction(value) and value.__module__ == events.__name__
                and inspect.signature(value).return_annotation == "Message"]


def test_every_kind_has_a_constructor_and_a_row_of_the_table():
    kinds = {c(*[()] * c.__code__.co_argcount)[0] for c in CONSTRUCTORS}
    assert kinds == set(events.dispatch_table(Recorder()))


@pytest.mark.parametrize("constructor", CONSTRUCTORS, ids=lambda c: c.__name__)
def test_the_export_session_takes_each_kind_with_its_constructors_fields(constructor):
    handler = getattr(ExportSession, f"on_{constructor.__name__}")
    assert (list(inspect.signature(handler).parameters)[1:]  # (self)
            == list(inspect.signature(constructor).parameters))


@pytest.mark.parametrize("constructor", CONSTRUCTORS, ids=lambda c: c.__name__)
def test_each_message_reaches_the_handler_of_its_name(constructor):
    recorder = Recorder()
    fields = [()] * constructor.__code__.co_argcount
    events.Dispatcher(recorder)(constructor(*fields))
    assert [name for name, _ in recorder.calls] == [f"on_{constructor.__name__}"]
