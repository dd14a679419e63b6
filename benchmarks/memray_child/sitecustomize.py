"""Runs the export process under memray (``bench_memory.py --memray DIR``): on the
path of the scheduler's processes, it starts a tracker in the export process only,
native stacks, aggregated, and writes it when the process ends (by ``os._exit``)."""
from __future__ import annotations

import os

_OUT = os.environ.get("DASK_OTEL_SPANS_BENCH_MEMRAY")
try:
    with open("/proc/self/cmdline", "rb") as _f:
        _CMD = _f.read()
except OSError:
    _CMD = b""

if _OUT and b"dask_otel_spans.transport.child" in _CMD:
    import memray

    _tracker = memray.Tracker(
        os.path.join(_OUT, f"export-{os.getpid()}.memray"), native_traces=True,
        file_format=memray.FileFormat.AGGREGATED_ALLOCATIONS)
    _tracker.__enter__()
    _real_exit = os._exit

    def _exit(code: int) -> None:  # (the export process ends by os._exit)
        try:
            _tracker.__exit__(None, None, None)
        finally:
            _real_exit(code)

    os._exit = _exit  # type: ignore[assignment]
