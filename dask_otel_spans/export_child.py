"""The export process's former entry point, kept for what starts it by name:
``python -m dask_otel_spans.export_child`` runs :mod:`dask_otel_spans.transport.child`."""
from __future__ import annotations

if __name__ == "__main__":
    import runpy

    runpy.run_module("dask_otel_spans.transport.child", run_name="__main__",
                     alter_sys=True)
