"""The report: one self-contained HTML file of a run's traces (no backend, no network
when opened), from OTLP-JSON files; ``dask-otel-spans report`` and
:func:`dask_otel_spans.report` (inline in Jupyter)."""
