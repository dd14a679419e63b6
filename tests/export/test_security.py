"""Nothing from the user's data reaches a span or metric by default; code snippets only
when opted in, cut; TLS and an authentication header for OTLP through OTEL_* variables."""
from __future__ import annotations

import subprocess

import grpc
import pytest
from distributed.utils_test import gen_cluster
from support.plugin import FAST, install
from support.polling import async_wait_for
from support.providers import MemoryProviders
from support.receivers import RECEIVER_THREADS, OTLPReceiver

from dask_otel_spans import OTelSpansPlugin, names, span

SECRET = "hunter2-credit-card-4111111111111111"


def identity(x):
    return x


def _all_strings(memory: MemoryProviders) -> str:
    parts = []
    for sp in memory.spans():
        parts.append(sp.name)
        parts += [str(v) for v in (sp.attributes or {}).values()]
    for metric in (names.SPAN_ACTIVITY_TIME, names.SPAN_ACTIVITY_DATA,
                   names.SPAN_ACTIVITY_COUNT, names.SPAN_ACTIVITY_CUSTOM,
                   names.SPAN_DURATION, names.SPAN_ACTIVE):
        for _, attrs, _ in memory.points(metric):
            parts += [str(v) for v in attrs.values()]
    return "\n".join(parts)


@gen_cluster(client=True, config={"distributed.diagnostics.computations.nframes": 2})
async def test_no_user_data_in_spans_or_metrics_by_default(c, s, a, b):
    memory = MemoryProviders()
    plugin = await install(c, memory)
    with span("wf"):
        assert await c.submit(identity, SECRET, key="identity-1") == SECRET
    await async_wait_for(lambda: memory.by_name("wf"))
    await plugin.flush()
    exported = _all_strings(memory)
    assert "hunter2" not in exported
    # (the whole number: a short run of its digits turns up in float attributes)
    assert "4111111111111111" not in exported
    assert names.SPAN_CODE not in memory.by_name("wf")[0].attributes


@gen_cluster(client=True, config={"distributed.diagnostics.computations.nframes": 2})
async def test_code_snippets_only_when_opted_in_and_cut(c, s, a, b):
    memory = MemoryProviders()
    await install(c, memory, include_code=True, max_code_length=60)
    with span("wf"):
        await c.submit(identity, 1, key="identity-1")
    await async_wait_for(lambda: memory.by_name("wf"))
    code = memory.by_name("wf")[0].attributes[names.SPAN_CODE]
    assert 0 < len(code) <= 60
    assert code.startswith("# ")


@pytest.fixture
def tls_files(tmp_path):
    """A key and a self-signed certificate for localhost (made by openssl)."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return key, cert


@pytest.fixture
def tls_receiver(tls_files) -> OTLPReceiver:
    """A receiver over TLS that turns away a request without its bearer token."""
    key, cert = tls_files
    credentials = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    receiver = OTLPReceiver(required_headers={"authorization": "Bearer t0k3n"},
                            credentials=credentials).start()
    yield receiver
    receiver.stop()


@gen_cluster(client=True, clean_kwargs=RECEIVER_THREADS)
async def test_otlp_over_tls_with_an_api_key(c, s, a, b, tls_files, tls_receiver):
    _, cert = tls_files
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": tls_receiver.endpoint,
        "OTEL_EXPORTER_OTLP_CERTIFICATE": str(cert),
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20t0k3n",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
    assert tls_receiver.endpoint.startswith("https://")
    plugin = OTelSpansPlugin(environ=environ, use_global_providers=False, **FAST)
    await c.register_plugin(plugin)
    with span("over tls"):
        await c.submit(identity, 1, key="identity-1")
    await async_wait_for(lambda: any(sp["name"] == "over tls" for sp in tls_receiver.spans()))
    await plugin.close()
    assert tls_receiver.rejected == 0
    assert tls_receiver.metadata[0]["authorization"] == "Bearer t0k3n"
