"""``Report``: the report of a run read from its OTLP-JSON files, saved as one HTML file
or shown inline in Jupyter; :func:`report` makes one from paths or from a client."""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from dask_otel_spans.reports.flames import flame_trees
from dask_otel_spans.reports.model import FileSpan, Summary, build
from dask_otel_spans.reports.render import render, render_fragment
from dask_otel_spans.reports.sources import read_files, traces_files_of
from dask_otel_spans.sdk.otlpjson import exception_logs
from dask_otel_spans.wording import counted

if TYPE_CHECKING:
    from distributed import Client

#: Where the embedded default writes (``otel-spans.output-dir``'s default)
DEFAULT_DIRECTORY = "dask-otel-spans"


class Report:
    """The report of the spans of some OTLP-JSON files.

    Parameters
    ----------
    paths:
        Traces files (``traces.jsonl``, or any OTLP-JSON lines file, as the OTel
        Collector's file exporter writes them), or directories of the embedded
        default (the scheduler's file and those of the worker processes below it)
    spans:
        The spans to show, when not all those of ``paths`` (their exception log
        events are still read from beside ``paths``)

    Raises
    ------
    FileNotFoundError
        For a path that does not exist, or a directory that holds no traces file
    ~dask_otel_spans.reports.sources.NotATracesFile
        For a file of other signals (``metrics.jsonl``, ``logs.jsonl``): a
        ``ValueError``
    """

    def __init__(self, paths: Sequence[str],
                 spans: Sequence[FileSpan] | None = None):
        self.files = traces_files_of(paths)
        if spans is None:
            spans = read_files(self.files)
        self.data = build(spans, exception_logs(self.files))
        #: prefix span row id -> its flame graph's tree (profile files beside the
        #: traces files)
        self.profiles = flame_trees(self.files, self.data)

    @property
    def summary(self) -> Summary:
        return self.data["summary"]

    def html(self) -> str:
        """The report as one self-contained HTML page."""
        return render(self.data, profiles=self.profiles)

    def save(self, path: str = "report.html") -> str:
        """Write the page to ``path``; its absolute path."""
        path = os.path.abspath(path)
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.html())
        return path

    def _repr_html_(self) -> str:
        return render_fragment(self.data, self.profiles)

    def __repr__(self) -> str:
        s = self.summary
        return (f"<Report: {counted(s['traces'], 'trace')}, {counted(s['spans'], 'span')}, "
                f"{counted(s['tasks'], 'task')}, {s['erred']} erred, from "
                f"{counted(len(self.files), 'file')}>")


def report(source: str | os.PathLike[str] | Iterable[str | os.PathLike[str]] | Client
           | None = None, timeout: float = 30.0) -> Report:
    """The report of a run, to show in Jupyter (it renders inline) or to save.

    Parameters
    ----------
    source:
        A path or a list of paths (see :class:`Report`); a ``distributed.Client``,
        whose scheduler's exports are waited for (:func:`~dask_otel_spans.wait_for_export`)
        and read from the files it writes (the embedded default's); default: the
        embedded default's directory, ``./dask-otel-spans``

    Raises
    ------
    FileNotFoundError
        For a path that does not exist, or a directory that holds no traces file
    ValueError
        For a file of other signals given as a traces file
        (:class:`~dask_otel_spans.reports.sources.NotATracesFile`), or a client whose
        scheduler exports its traces elsewhere than to files

    Examples
    --------
    >>> from dask_otel_spans import report, wait_for_export  # doctest: +SKIP
    >>> report(client)  # doctest: +SKIP
    """
    if source is None:
        return Report([DEFAULT_DIRECTORY])
    if isinstance(source, (str, os.PathLike)):
        return Report([os.fspath(source)])
    if hasattr(source, "run_on_scheduler"):
        from dask_otel_spans.client import wait_for_export

        state = wait_for_export(cast("Client", source), timeout=timeout)
        where = str(state.traces_to)
        if not where.endswith(".jsonl"):
            raise ValueError(
                f"the scheduler exports its traces to {where}, not to files: the report "
                "reads OTLP-JSON files (the embedded default, or the Collector's file "
                "exporter)")
        return Report([os.path.dirname(where)])
    return Report([os.fspath(p) for p in source])
