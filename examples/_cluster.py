"""Shared by the examples: a client to ADDRESS (a scheduler started with
``--preload dask_otel_spans``, workers too), or a LocalCluster with the plugins when
none is given."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from distributed import Client, LocalCluster

from dask_otel_spans import OTelSpansPlugin, OTelWorkerPlugin, wait_for_export


@contextlib.contextmanager
def connect(address: str | None, output_dir: str | None = None) -> Iterator[Client]:
    """A client to the scheduler at ``address``, else to a LocalCluster with the
    plugins registered (scheduler and workers), whose spans are exported before it
    closes.

    Parameters
    ----------
    address:
        The scheduler's address (``tcp://HOST:PORT``); None for a LocalCluster
    output_dir:
        The LocalCluster's embedded default directory (default: the plugins' own,
        ``otel-spans.output-dir``); a remote scheduler writes where its own
        configuration says
    """
    if address:
        with Client(address, timeout=60) as client:
            yield client
        return
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            settings = {"output_dir": output_dir} if output_dir else {}
            client.register_plugin(OTelSpansPlugin(**settings))
            # task code runs in its span's trace: spans and logs made in tasks join it
            client.register_plugin(OTelWorkerPlugin(output_dir=output_dir))
            yield client
            wait_for_export(client)
