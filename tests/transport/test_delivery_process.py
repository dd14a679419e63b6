"""Delivery across export processes: batches the export process spilled are sent by
the next one when it was killed; batches held for one backend are never sent to
another by an export process sharing the spool, and ``dask-otel-spans resend`` sends
them to theirs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

from distributed.utils_test import gen_cluster, inc
from support.plugin import FAST
from support.polling import async_wait_for
from support.processes import free_port
from support.receivers import RECEIVER_THREADS, OTLPReceiver

from dask_otel_spans import OTelSpansPlugin, names, span


def grpc_environ(port: int) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_EXPORTER_OTLP_TIMEOUT": "0.5",
        "OTEL_BSP_SCHEDULE_DELAY": "20",
    }


async def install(c, port: int, spool) -> OTelSpansPlugin:
    """A plugin whose export process sends to ``port`` and writes every batch it
    holds to ``spool`` at once (``spool.max-memory: 0``)."""
    plugin = OTelSpansPlugin(
        export_process=True, environ=grpc_environ(port), use_global_providers=False,
        spool_max_memory=0, spool_directory=str(spool), shutdown_timeout=1.0, **FAST,
    )
    await c.register_plugin(plugin)
    return plugin


def spooled(plugin: OTelSpansPlugin) -> int:
    return plugin.export_figures().signal("traces").spooled or 0


def dask_span_names(receiver: OTLPReceiver) -> list[str]:
    return sorted(sp["name"] for sp in receiver.spans() if names.SPAN_ID in sp["attributes"])


@gen_cluster(client=True, timeout=120, clean_kwargs=RECEIVER_THREADS)
async def test_batches_spilled_by_a_killed_export_process_are_sent_by_the_next(
        c, s, a, b, tmp_path):
    port = free_port()  # (nothing listens there yet)
    plugin = await install(c, port, tmp_path / "spool")
    supervisor = plugin.transport.sender.supervisor
    with span("held"):
        await c.submit(inc, 1, key="held-1")
    await async_wait_for(lambda: spooled(plugin) >= 2, timeout=60)  # (span, prefix span)
    os.kill(supervisor.pid, signal.SIGKILL)
    await async_wait_for(lambda: not supervisor.child_running, timeout=30)
    receiver = OTLPReceiver(port=port).start()
    try:
        with span("after"):  # (a new export process starts for it)
            await c.submit(inc, 2, key="after-1")
        await async_wait_for(lambda: dask_span_names(receiver) == ["after", "held"],
                             timeout=60)
        await plugin.close()
        ids = [sp["spanId"] for sp in receiver.spans()]
        assert len(ids) == len(set(ids)) == 4
        assert supervisor.restarts == 1
    finally:
        receiver.stop()


@gen_cluster(client=True, timeout=120, clean_kwargs=RECEIVER_THREADS)
async def test_what_was_held_for_one_backend_goes_to_it_never_to_another(
        c, s, a, b, tmp_path, capfd):
    """Two export processes, one for receiver A (down), then one for receiver B,
    share a spool directory: B's leaves A's batches where they are (said once at its
    start) and gets only its own; ``dask-otel-spans resend`` sends A's to A."""
    spool = tmp_path / "spool"
    port_a = free_port()  # (nothing listens there yet)
    plugin = await install(c, port_a, spool)
    with span("for a"):
        await c.submit(inc, 1, key="for-a-1")
    await async_wait_for(lambda: spooled(plugin) >= 2, timeout=60)  # (span, prefix span)
    await plugin.close()  # (the export process ends; the spool keeps its batches)
    s.remove_plugin(name=names.PLUGIN_NAME)
    receiver_b = OTLPReceiver().start()
    try:
        plugin = await install(c, receiver_b.port, spool)
        with span("for b"):
            await c.submit(inc, 2, key="for-b-1")
        await async_wait_for(lambda: dask_span_names(receiver_b) == ["for b"],
                             timeout=60)
        await plugin.close()
        assert dask_span_names(receiver_b) == ["for b"] and len(receiver_b.spans()) == 2
    finally:
        receiver_b.stop()
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if "does not send" in line]
    assert len(said) == 1, err
    assert f"(2 spans) for traces to OTLP grpc http://127.0.0.1:{port_a}; " in said[0]
    receiver_a = OTLPReceiver(port=port_a).start()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "dask_otel_spans.cli", "resend", str(spool),
             "--timeout", "20"], env={**os.environ, **grpc_environ(receiver_b.port)},
            capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert ": 2 spans delivered, 0 failed" in done.stdout
        assert dask_span_names(receiver_a) == ["for a"]
        assert len({sp["spanId"] for sp in receiver_a.spans()}) == 2
    finally:
        receiver_a.stop()
