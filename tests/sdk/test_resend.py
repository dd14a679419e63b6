"""``resend``: each held batch to the destination it was held for, with the
environment's credentials only where they are the ones it was held with; every batch
to the environment's endpoint only when asked; against real OTLP receivers."""
from __future__ import annotations

import os
import zlib

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from support.processes import free_port
from support.receivers import OTLPHttpReceiver, OTLPReceiver

from dask_otel_spans.cli import main
from dask_otel_spans.sdk.destination import Destination, destination_of
from dask_otel_spans.sdk.resend import resend
from dask_otel_spans.sdk.spool import Spool


def request(name: str) -> bytes:
    """An OTLP trace request of one span named ``name``."""
    out = ExportTraceServiceRequest()
    span = out.resource_spans.add().scope_spans.add().spans.add()
    span.name, span.trace_id, span.span_id = name, os.urandom(16), os.urandom(8)
    return out.SerializeToString()


def environ_to(endpoint: str, protocol: str = "grpc", **extra: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
            "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5", **extra}


def hold(directory, destination: Destination, *names: str) -> None:
    """What an export that ended left for ``destination``: one batch per name."""
    spool = Spool(str(directory), max_memory=0, max_disk=10**6)
    spool.open()
    for name in names:
        spool.put(destination, request(name), 1)
    spool.close()


def names(receiver) -> list[str]:
    return sorted(span["name"] for span in receiver.spans())


@pytest.fixture
def receivers():
    """Two receivers, A (gRPC) and B (HTTP), each wanting its own API key."""
    a = OTLPReceiver(required_headers={"api-key": "key-a"}).start()
    b = OTLPHttpReceiver().start()
    yield a, b
    a.stop()
    b.stop()


def test_each_batch_goes_to_the_destination_it_was_held_for(receivers, tmp_path):
    a, b = receivers
    headers = {"OTEL_EXPORTER_OTLP_HEADERS": "api-key=key-a"}
    hold(tmp_path, destination_of(environ_to(a.endpoint, **headers), "traces"), "for-a")
    hold(tmp_path, destination_of(environ_to(b.endpoint, "http/protobuf", **headers),
                              "traces"), "for-b")
    # (the environment names neither: its credentials are theirs)
    outcome = resend(str(tmp_path), environ_to(f"http://127.0.0.1:{free_port()}",
                                               **headers), timeout=20)
    assert names(a) == ["for-a"] and names(b) == ["for-b"]
    assert sorted((r.where, r.figures.delivered) for r in outcome.resent) == sorted([
        (f"OTLP grpc to {a.endpoint}", 1),
        (f"OTLP http/protobuf to {b.endpoint}/v1/traces", 1)])
    assert outcome.left == []
    again = resend(str(tmp_path), environ_to(a.endpoint, **headers), timeout=5)
    assert again.resent == [] and again.left == []  # (acknowledged: gone)


def test_a_batch_held_with_other_credentials_is_left_with_one_line(receivers,
                                                                    tmp_path):
    a, _ = receivers
    held = environ_to(a.endpoint, OTEL_EXPORTER_OTLP_HEADERS="api-key=key-a")
    hold(tmp_path, destination_of(held, "traces"), "kept")
    outcome = resend(str(tmp_path), environ_to(
        a.endpoint, OTEL_EXPORTER_OTLP_HEADERS="api-key=key-of-b"), timeout=2)
    assert a.metadata == [] and outcome.resent == []
    [line] = outcome.left
    assert line.startswith(f"1 batch (1 span) of traces held for OTLP grpc "
                           f"{a.endpoint} with other credentials")
    assert "key-a" not in line and "key-of-b" not in line
    assert "--any-destination" in line
    assert resend(str(tmp_path), held, timeout=20).left == []  # (still there)
    assert names(a) == ["kept"]


def test_any_destination_sends_every_batch_where_the_environment_says(receivers,
                                                                      tmp_path):
    a, b = receivers
    hold(tmp_path, destination_of(environ_to(f"http://127.0.0.1:{free_port()}",
                                         OTEL_EXPORTER_OTLP_HEADERS="api-key=old"),
                              "traces"), "held-for-a-gone-backend")
    outcome = resend(str(tmp_path), environ_to(a.endpoint,
                                               OTEL_EXPORTER_OTLP_HEADERS="api-key=key-a"),
                     timeout=20, any_destination=True)
    assert names(a) == ["held-for-a-gone-backend"] and outcome.left == []
    assert a.rejected == 0


def test_a_batch_of_an_unknown_destination_is_sent_only_when_asked(receivers,
                                                                   tmp_path):
    """(Written before batches were bound to their destination.)"""
    _, b = receivers
    folder = tmp_path / "1-ended"
    folder.mkdir(mode=0o700)
    payload = request("old")
    (folder / f"{1:020d}-{1:08d}-1-{zlib.crc32(payload):08x}.traces.pb").write_bytes(
        payload)
    environ = environ_to(b.endpoint, "http/protobuf")
    [line] = resend(str(tmp_path), environ, timeout=2).left
    assert "of an unknown destination" in line and names(b) == []
    assert resend(str(tmp_path), environ, timeout=20, any_destination=True).left == []
    assert names(b) == ["old"]


def test_the_command_says_what_it_left_and_fails(receivers, tmp_path, monkeypatch,
                                                 capsys):
    a, _ = receivers
    hold(tmp_path, destination_of(environ_to(a.endpoint,
                                         OTEL_EXPORTER_OTLP_HEADERS="api-key=key-a"),
                              "traces"), "kept")
    for name, value in environ_to(a.endpoint).items():
        monkeypatch.setenv(name, value)
    assert main(["resend", str(tmp_path), "--timeout", "1"]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert "with other credentials" in line and "key-a" not in line
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=key-a")
    assert main(["resend", str(tmp_path), "--timeout", "20"]) == 0
    assert names(a) == ["kept"]


def test_user_info_counts_as_a_credential_and_is_said_masked(tmp_path):
    """(Whether it arrives is the sender's matter: here nothing listens.)"""
    endpoint = f"http://jane:pass-word@127.0.0.1:{free_port()}"
    hold(tmp_path, destination_of(environ_to(endpoint, "http/protobuf"), "traces"),
         "kept")
    bare = endpoint.replace("jane:pass-word@", "")
    [line] = resend(str(tmp_path), environ_to(bare, "http/protobuf"), timeout=0.5).left
    assert "other credentials" in line and "pass-word" not in line and "jane" not in line
    # (the user info of the signal's endpoint, whatever host that names)
    elsewhere = f"http://jane:pass-word@127.0.0.1:{free_port()}"
    outcome = resend(str(tmp_path), environ_to(elsewhere, "http/protobuf"), timeout=0.5)
    assert outcome.left == []
    assert [r.where for r in outcome.resent] == [
        "OTLP http/protobuf to " + endpoint.replace("pass-word", "***") + "/v1/traces"]


def test_a_spool_directory_others_may_write_is_not_resent_from(tmp_path, capsys):
    hold(tmp_path, destination_of(environ_to("http://127.0.0.1:9"), "traces"), "kept")
    tmp_path.chmod(0o777)
    assert main(["resend", str(tmp_path), "--timeout", "1"]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"nothing sent: the spool {tmp_path} was not opened")


def test_a_configuration_that_cannot_work_is_one_line(tmp_path, monkeypatch, capsys):
    hold(tmp_path, destination_of(environ_to("http://127.0.0.1:9"), "traces"), "kept")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
    assert main(["resend", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    [line] = err.splitlines()
    assert line.startswith("dask-otel-spans resend: OTEL_EXPORTER_OTLP_PROTOCOL") and not out
