"""The traces files ``tree`` and the report read, from the paths a user gives (traces
files, or directories of the embedded default), and their spans as both show them.
A path that holds no traces file, or a file of other signals given as one, is an
error with one clear line: the same for the command line and the Python API."""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, cast

from dask_otel_spans.reports.running import with_running
from dask_otel_spans.sdk.otlpjson import (
    PROCESSES_DIR,
    TRACES_FILE,
    WORKERS_DIR,
    read_spans,
    traces_files,
)

if TYPE_CHECKING:
    from dask_otel_spans.reports.model import FileSpan

#: The top-level key of each signal's OTLP-JSON export request -> what it holds
_SIGNAL_KEYS = {"resourceSpans": "spans", "resourceMetrics": "metric points",
                "resourceLogs": "log records"}


class NotATracesFile(ValueError):
    """A file given as a traces file that holds no spans but other OTLP-JSON data
    (metrics, log records), or no OTLP-JSON at all."""


def traces_files_of(paths: Iterable[str]) -> list[str]:
    """The traces files of ``paths``: each a traces file (the embedded default's
    ``traces.jsonl``, or any OTLP-JSON lines file of spans, as the OTel Collector's
    file exporter writes them), or a directory of the embedded default (its
    ``traces.jsonl`` and those of the processes below it).

    Raises
    ------
    FileNotFoundError
        For a path that does not exist, or a directory that holds no traces file
    NotATracesFile
        For a file that holds no spans but other signals (``metrics.jsonl``,
        ``logs.jsonl``), or is not OTLP-JSON lines (a ``ValueError``)
    """
    files: list[str] = []
    for path in paths:
        found = [f for f in traces_files(path) if os.path.exists(f)]
        if not found:
            raise FileNotFoundError(_missing(path))
        if not os.path.isdir(path):
            _check_signal(path)
        files += found
    return files


def _missing(path: str) -> str:
    if not os.path.isdir(path):
        return f"no such file or directory: {path}"
    below = os.path.join(f"{{{WORKERS_DIR},{PROCESSES_DIR}}}", "*", TRACES_FILE)
    return f"no traces file in {path} (neither {TRACES_FILE} nor {below})"


def _check_signal(path: str) -> None:
    """Raise :class:`NotATracesFile` unless ``path`` is empty or a line of it is a
    traces export request. (A key's name is looked for, not parsed: a traces file's
    first line decides at once; the Collector's file exporter may write the signals
    of several pipelines to one file.)"""
    held: set[str] = set()
    empty = True
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line.strip():
                continue
            empty = False
            held.update(key for key in _SIGNAL_KEYS if f'"{key}"' in line)
            if "resourceSpans" in held:
                return
    if empty:
        return
    what = " and ".join(_SIGNAL_KEYS[key] for key in _SIGNAL_KEYS if key in held)
    raise NotATracesFile(f"not a traces file: {path} holds "
                         + (what if what else "no OTLP-JSON export requests")
                         + ", no spans")


def read_files(files: Sequence[str]) -> list[FileSpan]:
    """The spans of traces ``files`` (:func:`traces_files_of`) as ``tree`` and the
    report show them: each with the ``file`` it was read from, plus the spans still
    running (:func:`~dask_otel_spans.reports.running.with_running`)."""
    spans = []
    for path in files:
        for span in cast("list[FileSpan]", read_spans(path)):
            span["file"] = path
            spans.append(span)
    return with_running(files, spans)
