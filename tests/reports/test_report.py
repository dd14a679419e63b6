"""``dask_otel_spans.report``: from a client (its exports waited for, read from the
embedded default's files), from paths; inline in Jupyter (a sandboxed iframe holding
the same page); ``dask-otel-spans report`` writes the file."""
from __future__ import annotations

import html
import json
import re

import pytest
from distributed import Client, LocalCluster
from support import browser
from support.otlpfiles import metrics_line, traces_line, write
from support.otlpfiles import span as file_span

import dask_otel_spans
from dask_otel_spans import OTelSpansPlugin, span
from dask_otel_spans.cli import main as cli_main


def inc(x: int) -> int:
    return x + 1


@pytest.mark.cluster  # (an in-process LocalCluster)
def test_a_report_from_a_client_shows_its_run(tmp_path):
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        client.register_plugin(OTelSpansPlugin(
            environ={}, use_global_providers=False, output_dir=str(tmp_path),
            export_process=False, export_delay=0.1, idle_timeout=1.0))
        with span("etl"):
            client.submit(inc, 1, key="inc-1").result()
        made = dask_otel_spans.report(client)
    assert made.summary["tasks"] == 1 and made.summary["spans"] >= 2
    assert [r["name"] for r in made.data["traces"][0]["rows"]][:2] == ["etl", "inc"]
    fragment = made._repr_html_()
    assert fragment.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in fragment
    assert html.escape(made.html(), quote=True) in fragment


def test_the_command_writes_the_report_of_the_files_given(tmp_path, capsys):
    traces = tmp_path / "traces.jsonl"
    traces.write_text(
        '{"resourceSpans":[{"resource":{"attributes":[]},"scopeSpans":[{"spans":[{'
        '"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203331",'
        '"name":"work","startTimeUnixNano":"1000000","endTimeUnixNano":"3000000",'
        '"attributes":[{"key":"dask.span.id","value":{"stringValue":"x"}},'
        '{"key":"dask.span.task_count","value":{"intValue":"4"}}]}]}]}]}\n')
    out = tmp_path / "out.html"
    assert cli_main(["report", str(traces), "-o", str(out)]) == 0
    assert "Report of 1 trace, 1 span (4 tasks, 0 erred)" in capsys.readouterr().out
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and '"name":"work"' in page


def test_the_command_says_when_there_is_nothing_to_report(tmp_path, capsys):
    assert cli_main(["report", str(tmp_path / "nowhere"), "-o",
                     str(tmp_path / "r.html")]) == 1
    assert capsys.readouterr().err == (
        f"no such file or directory: {tmp_path / 'nowhere'}\n")


@pytest.mark.parametrize("command", ["tree", "report"])
def test_a_traces_file_without_spans_is_one_line_in_tree_and_report(command, tmp_path,
                                                                     capsys):
    (tmp_path / "traces.jsonl").write_text("")
    assert cli_main([command, str(tmp_path), "-o", str(tmp_path / "r.html")]
                    if command == "report" else [command, str(tmp_path)]) == 1
    assert capsys.readouterr().err == f"no spans in {tmp_path / 'traces.jsonl'}\n"
    assert not (tmp_path / "r.html").exists()


def test_a_report_of_a_path_that_does_not_exist_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or directory: .*nowhere"):
        dask_otel_spans.report(str(tmp_path / "nowhere"))


def test_a_report_of_a_directory_without_traces_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no traces file in "):
        dask_otel_spans.report(tmp_path)


def test_a_report_of_a_metrics_file_raises_a_value_error(tmp_path):
    metrics = write(tmp_path / "metrics.jsonl", metrics_line())
    with pytest.raises(ValueError, match="not a traces file: .* holds metric points"):
        dask_otel_spans.report([metrics])


@pytest.mark.cluster  # (a browser)
def test_a_report_with_nan_and_infinite_attributes_renders_its_spans(tmp_path):
    traces = tmp_path / "traces.jsonl"
    traces.write_text(traces_line([
        file_span("a1", "load", attributes={"dask.span.id": "x", "ratio": float("nan"),
                                       "dask.metrics.thread-cpu.seconds": float("inf")}),
        file_span("a2", "inc", parent="a1", start_ms=10, end_ms=50,
             attributes={"dask.task.prefix": "inc", "limit": float("-inf")}),
    ]))
    out = tmp_path / "report.html"
    assert cli_main(["report", str(traces), "-o", str(out)]) == 0
    dom = browser.dump_dom(browser.probed_copy(out, tmp_path))
    assert browser.body_attribute(dom, "data-rendered") == "1"
    assert json.loads(browser.body_attribute(dom, "data-probe-errors") or "") == []
    assert re.findall(r'<div id="row-(\w+)"', dom) == ["a1", "a2"]
    data = json.loads(re.search(r'id="report-data">(.*?)</script>', dom).group(1))
    attrs = [row["attrs"] for row in data["traces"][0]["rows"]]
    assert (attrs[0]["ratio"], attrs[1]["limit"]) == ("NaN", "-Infinity")
    assert attrs[0]["dask.metrics.thread-cpu.seconds"] == "Infinity"
