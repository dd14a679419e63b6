"""Shared by the examples: a client to ADDRESS (a scheduler started with
``--preload dask_otel_spans``, workers too), or a LocalCluster with the plugins when
none is given."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from distributed import Client, LocalCluster

from dask_otel_spans import OTelSpansPlugin, OTelWorkerPlugin, wait_for_export


@contextlib.contextmanager
def connect(address: str | None) -> Iterator[Client]:
    if address:
        with Client(address, timeout=60) as client:
            yield client
        return
    with LocalCluster(n_workers=2, threads_per_worker=2, dashboard_address=":0") as cluster:
        with Client(cluster) as client:
            client.register_plugin(OTelSpansPlugin())
            client.register_plugin(OTelWorkerPlugin())
            yield client
            wait_for_export(client)
