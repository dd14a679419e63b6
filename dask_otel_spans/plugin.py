"""The scheduler plugin's former path, kept for what names it by path: plugins pickled
by an earlier version (``dask_otel_spans.plugin._restore_plugin``) and imports of
``dask_otel_spans.plugin.OTelSpansPlugin``. The plugin lives in
:mod:`dask_otel_spans.scheduler.plugin`."""
from __future__ import annotations

from dask_otel_spans.scheduler.pickling import restore_plugin
from dask_otel_spans.scheduler.plugin import OTelSpansPlugin

#: the name earlier versions pickled
_restore_plugin = restore_plugin

__all__ = ["OTelSpansPlugin"]
