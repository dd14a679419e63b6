"""The protocol's dispatch: every message calls its handler with its fields; what is
not of the protocol is refused by name, never half-applied."""
from __future__ import annotations

import pytest
from support.stand_ins import Recorder

from dask_otel_spans.export.session import ExportSession
from dask_otel_spans.protocol import events


def test_a_message_calls_its_handler_with_its_fields():
    recorder = Recorder()
    events.dispatch(recorder, (events.CLIENT_GONE, 5.0, "client-1"))
    assert recorder.calls == [("on_client_gone", (5.0, "client-1"))]


@pytest.mark.parametrize("message", [("bogus", 1), (), None, ("client-gone", 5.0)],
                         ids=["unknown kind", "empty", "not a tuple", "a field short"])
def test_a_message_not_of_the_protocol_is_refused(message):
    recorder = Recorder()
    with pytest.raises(events.UnknownMessage):
        events.dispatch(recorder, message)
    assert recorder.calls == []


def test_the_export_session_handles_every_kind_with_the_fields_it_names():
    import inspect

    for kind, (fields, method) in events.TABLE.items():
        handler = getattr(ExportSession, method, None)
        assert handler is not None, kind
        parameters = list(inspect.signature(handler).parameters)[1:]  # (self)
        assert len(parameters) == len(fields._fields), kind
