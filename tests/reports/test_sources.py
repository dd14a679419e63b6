"""The traces files of the paths a user gives ``tree``, ``report`` and
:func:`dask_otel_spans.report`: a file of spans, whichever its name; a file of other
signals, or a path without a traces file, refused with one line; each span read with
the file it came from."""
from __future__ import annotations

import pytest
from support.otlpfiles import exception_log_line, metrics_line, span, traces_line, write

from dask_otel_spans.reports.sources import NotATracesFile, read_files, traces_files_of


def test_a_collector_file_of_every_signal_is_a_traces_file(tmp_path):
    """The Collector's file exporter in the metrics, logs and traces pipelines writes
    one file: its spans are read, whichever line comes first."""
    mixed = write(tmp_path / "otel.json", metrics_line(),
                  exception_log_line("s1", "E", "m"), traces_line([span("s1", "work")]))
    assert traces_files_of([str(mixed)]) == [str(mixed)]
    assert [s["name"] for s in read_files([str(mixed)])] == ["work"]


def test_an_empty_traces_file_is_a_traces_file(tmp_path):
    empty = write(tmp_path / "traces.jsonl")
    assert traces_files_of([str(empty)]) == [str(empty)]


def test_a_file_that_is_not_otlp_json_is_not_a_traces_file(tmp_path):
    page = write(tmp_path / "report.html", "<!DOCTYPE html><html></html>\n")
    with pytest.raises(NotATracesFile, match="holds no OTLP-JSON export requests"):
        traces_files_of([str(page)])


def test_a_directory_gives_the_scheduler_s_and_the_processes_files(tmp_path):
    top = write(tmp_path / "traces.jsonl", traces_line([span("s1", "a")]))
    worker = write(tmp_path / "workers" / "w-1" / "traces.jsonl",
                   traces_line([span("s2", "b")]))
    assert traces_files_of([str(tmp_path)]) == [str(top), str(worker)]


def test_each_span_is_read_with_its_file(tmp_path):
    worker = write(tmp_path / "workers" / "w-1" / "traces.jsonl",
                   traces_line([span("s2", "b")]))
    [read] = read_files([str(worker)])
    assert read["file"] == str(worker)
