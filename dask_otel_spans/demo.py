"""``dask-otel-spans demo``: a small real workflow on a LocalCluster with the plugins
(scheduler and workers), in a new output of its own, and the span tree of its run."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
import warnings
import weakref
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from distributed.diagnostics.plugin import WorkerPlugin

from dask_otel_spans import names
from dask_otel_spans.cli import span_tree
from dask_otel_spans.protocol.profiles import PROFILES_DIR
from dask_otel_spans.reports.sources import read_files, traces_files_of
from dask_otel_spans.sdk.otlpjson import (
    LOGS_FILE,
    METRICS_FILE,
    PROCESSES_DIR,
    TRACES_FILE,
    WORKERS_DIR,
)
from dask_otel_spans.wording import counted

if TYPE_CHECKING:
    from distributed import Client, Worker

    from dask_otel_spans.client import ExportState


def _fit_model(i: int) -> int:
    """A task with a custom activity: its time shows as "model-fit" seconds and its
    rows as a custom unit."""
    from distributed.metrics import context_meter

    with context_meter.meter("model-fit"):
        time.sleep(0.05)
    context_meter.digest_metric("rows-scored", 1000 + i, "rows")
    return i


def _validate(i: int) -> int:
    """Task code with a span of its own (it joins the dask span's trace on a worker
    with the worker plugin); every seventh record is bad and the task raises."""
    from opentelemetry import trace

    with trace.get_tracer("dask-otel-spans demo").start_as_current_span("check record"):
        time.sleep(0.01)
        if i % 7 == 3:
            raise ValueError(f"record {i}: negative amount")
    return i


def _slow_inc(x: int) -> int:
    time.sleep(0.02)
    return x + 1


#: Printed before the validation step, whose one failing task makes dask log an error
VALIDATION_NOTICE = ("The validation step fails on purpose: one task raises, to show "
                     "how errors appear (dask logs it as \"Compute Failed\" below).")


def run_workflow(client: Client) -> None:
    """The demo's multi-step workflow, each step a nested dask span."""
    import dask
    import dask.array as da
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd

    from dask_otel_spans import span

    with span("demo workflow"):
        with span("array step"):
            x = da.random.default_rng(42).random((2000, 2000), chunks=(500, 500))
            (x @ x.T).mean().compute()
        with span("dataframe step"):
            pdf = pd.DataFrame(
                {"key": np.arange(100_000) % 17, "value": np.arange(100_000.0)}
            )
            df = dd.from_pandas(pdf, npartitions=8)
            df.groupby("key").value.sum().compute()
        with span("futures step"):
            futures = client.map(_slow_inc, range(40))
            total = dask.delayed(sum)(futures)
            client.compute(total).result()
        with span("custom activity", "model fit"):
            client.gather(client.map(_fit_model, range(8)))
        # (said first: the worker logs dask's "Compute Failed" block for it)
        print(VALIDATION_NOTICE, flush=True)
        with span("validation"):
            client.gather(client.map(_validate, range(8)), errors="skip")


#: What the demo's workflow imports beyond the package's own dependencies: the
#: ``demo`` extra
DEMO_MODULES = ("numpy", "pandas", "dask.array", "dask.dataframe")


def missing_demo_modules() -> list[str]:
    """The modules of the ``demo`` extra that cannot be imported here."""
    missing = []
    for name in DEMO_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def say_outcome(state: ExportState) -> int:
    """Print what came of the export (an :class:`~dask_otel_spans.state.ExportState`)
    where the demo cannot read the spans back: delivered, failed, still held, as the
    exporters counted; 1 when not everything was delivered."""
    print(state.outcome("traces"))
    print(state.outcome("metrics"))
    if state.flushed:
        print("(the demo prints the span tree from the embedded default's files only)")
        return 0
    print("Not everything was delivered (ExportState.flushed is False): no span tree",
          file=sys.stderr)
    return 1


#: The demo's export delay where the user set none (``otel-spans.export-delay``): its
#: spans are handed over half a second after their tasks are done
DEMO_EXPORT_DELAY = "500ms"


def demo_settings(export_delay: str | None = None) -> dict[str, Any]:
    """The settings the demo gives its scheduler plugin: ``export_delay``
    (``--export-delay``) when given; none where the user set
    ``otel-spans.export-delay`` (a ``DASK_OTEL_SPANS__EXPORT_DELAY``, a dask config
    file): the plugin reads it as any scheduler's does, a bad value being its one
    ERROR line and the shipped default; else :data:`DEMO_EXPORT_DELAY`."""
    from dask_otel_spans.config import user_set

    if export_delay is not None:
        return {"export_delay": export_delay}
    if user_set("export-delay"):
        return {}
    return {"export_delay": DEMO_EXPORT_DELAY}


#: What distributed's worker logs, with a traceback, when a heartbeat fails
HEARTBEAT_FAILED = "Failed to communicate with scheduler during heartbeat."


class ClosingHeartbeatFilter(logging.Filter):
    """Drops ``distributed.worker``'s ERROR and traceback for a heartbeat whose
    connection closed (an ``OSError``: ``CommClosedError``) while its worker was
    closing: ``Worker.close`` stops the heartbeat's periodic callback and then closes
    its connections, so a heartbeat sent just before, still awaiting the scheduler's
    answer, fails (dask/distributed#7105, #7891: intermittent at any LocalCluster's
    close). As distributed's client keeps quiet once its cluster closes (#7429),
    only a closing worker's is dropped: the same failure of a running worker, and
    every other record, pass."""

    def __init__(self, worker: object):
        super().__init__()
        self._worker = weakref.ref(worker)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != HEARTBEAT_FAILED or not record.exc_info:
            return True
        from distributed.core import Status

        worker = self._worker()
        closing = worker is None or getattr(worker, "status", None) in (
            Status.closing, Status.closed)
        return not (closing and isinstance(record.exc_info[1], OSError))


class QuietHeartbeatsAtClose(WorkerPlugin):
    """The demo's workers: :class:`ClosingHeartbeatFilter` on ``distributed.worker``,
    kept after the plugin's teardown (the race comes later in ``Worker.close``;
    the process ends with it)."""

    name = "dask-otel-spans-demo-quiet-heartbeats"

    def setup(self, worker: Worker) -> None:
        logging.getLogger("distributed.worker").addFilter(ClosingHeartbeatFilter(worker))


#: The demo's report, beside the files it is made from
REPORT_FILE = "report.html"
#: What a run of the demo leaves in its output directory: the embedded default's files
#: and directories (the scheduler's export process's, the workers', other
#: processes', the profiles) and the report
RUN_ENTRIES = (TRACES_FILE, METRICS_FILE, LOGS_FILE, WORKERS_DIR, PROCESSES_DIR,
               PROFILES_DIR, REPORT_FILE)
#: Where in the output directory earlier runs' entries are kept, one directory each
EARLIER_RUNS = "earlier-runs"


def set_aside_earlier_run(directory: str) -> str | None:
    """Move what an earlier run left in ``directory`` (:data:`RUN_ENTRIES`; nothing
    else of it) to ``directory/earlier-runs/<its time>/``, so that this run starts a
    new output (the file exporters append, as a cluster restarted wants); the
    directory it went to, None when there was nothing to move."""
    found = [os.path.join(directory, name) for name in RUN_ENTRIES
             if os.path.lexists(os.path.join(directory, name))]
    if not found:
        return None
    when = max(os.lstat(path).st_mtime for path in found)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    target = os.path.join(directory, EARLIER_RUNS, stamp)
    n = 1
    while os.path.lexists(target):
        n += 1
        target = os.path.join(directory, EARLIER_RUNS, f"{stamp}-{n}")
    os.makedirs(target)
    for path in found:
        os.rename(path, os.path.join(target, os.path.basename(path)))
    return target


def _start_new_output(directory: str) -> None:
    """:func:`set_aside_earlier_run`, said in one line (on stderr when it failed: the
    run adds to the earlier one's files, and shows its own spans only)."""
    try:
        kept = set_aside_earlier_run(directory)
    except OSError as e:
        print(f"Cannot move the earlier run's files in {directory} aside ({e}); this "
              "run adds to them", file=sys.stderr)
        return
    if kept is not None:
        print(f"The earlier run's files are now in {kept} (dask-otel-spans tree "
              f"{kept}); this run writes new ones")


def demo_output_dir(given: str | None = None) -> str:
    """The demo's output directory: ``given`` (``--output-dir``), else
    ``otel-spans.output-dir`` (``DASK_OTEL_SPANS__OUTPUT_DIR``, dask's config), as
    any cluster's plugins read it."""
    from dask_otel_spans.config import setting

    return given or setting("output-dir")


def cmd_demo(args: argparse.Namespace) -> int:
    missing = missing_demo_modules()
    if missing:
        print(f"dask-otel-spans demo needs the demo extra ({', '.join(missing)} cannot "
              "be imported): pip install 'dask_otel_spans[demo]'", file=sys.stderr)
        return 1
    from distributed import Client, LocalCluster

    from dask_otel_spans import OTelSpansPlugin, OTelWorkerPlugin
    from dask_otel_spans.client import wait_for_export

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    logging.getLogger("dask_otel_spans").setLevel(logging.INFO)
    output_dir = demo_output_dir(args.output_dir)
    _start_new_output(output_dir)
    print(f"Starting a LocalCluster ({counted(args.workers, 'worker')}) with the "
          "plugin ...")
    with LocalCluster(
        n_workers=args.workers,
        threads_per_worker=2,
        dashboard_address=":0",
        processes=True,
    ) as cluster, Client(cluster) as client:
        client.register_plugin(
            OTelSpansPlugin(output_dir=output_dir,
                            **demo_settings(args.export_delay)))
        # task code runs in its span's trace: spans made in tasks join it
        client.register_plugin(OTelWorkerPlugin(output_dir=output_dir))
        # (no traceback of a benign race as the cluster closes)
        client.register_plugin(QuietHeartbeatsAtClose())
        address = cluster.scheduler_address
        workers = set(client.scheduler_info()["workers"])
        t0 = time.time()
        with warnings.catch_warnings():
            # dask-expr warns about every annotation, distributed.span's included
            warnings.filterwarnings("ignore", message="Dask annotations")
            run_workflow(client)
        print(f"Workflow ran in {time.time() - t0:.2f}s; exporting ...")
        # Let the plugin hand over each span once its late heartbeats are in, rather
        # than at shutdown.
        state = wait_for_export(client)
    # the cluster is closed: the plugin flushed its exporters (and its export process)
    return show_run(state, address, workers)


def show_run(state: ExportState, address: str, workers: Collection[str]) -> int:
    """Print the span tree of the demo's run (the spans of scheduler ``address`` and
    of ``workers``) from the files the export went to, as ``tree`` prints it, and
    write its report; where the export went elsewhere, :func:`say_outcome`."""
    traces_to, metrics_to = state.traces_to, state.metrics_to
    if not (traces_to.endswith(TRACES_FILE) and os.path.exists(traces_to)):
        return say_outcome(state)
    # the files collect every run in this directory: this run's scheduler and
    # workers only (the workers' files are flushed as they close)
    files = traces_files_of([os.path.dirname(traces_to)])
    spans = [s for s in read_files(files)
             if s["resource"].get(names.SCHEDULER_ADDRESS) == address
             or s["resource"].get(names.WORKER_ADDRESS) in workers]
    if not spans:
        print("No spans were exported.", file=sys.stderr)
        return 1
    print()
    print(span_tree(files, spans))
    print()
    print(f"Traces went to {traces_to} (spans made in tasks: "
          f"{os.path.join(os.path.dirname(traces_to), 'workers', '*', TRACES_FILE)})")
    print(f"Metrics went to {metrics_to}")
    from dask_otel_spans.reports.report import Report

    path = Report([os.path.dirname(traces_to)], spans).save(
        os.path.join(os.path.dirname(traces_to), REPORT_FILE))
    print(f"Report (open it in a browser): {path}")
    return 0
