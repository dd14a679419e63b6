"""Real processes (``dask scheduler --preload dask_otel_spans``, ``dask worker``, the
embedded default's files): a workflow whose one prefix burns CPU in ``hot_loop``; its
prefix span names ``hot_loop`` first, and the report's flame graph, opened in
headless Chromium, has it as its widest frame below the task's entry."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from distributed import Client
from support import browser
from support.processes import DaskProcesses
from support.workloads import hot_loop

from dask_otel_spans import names, span, wait_for_export
from dask_otel_spans.reports.report import Report
from dask_otel_spans.sdk.otlpjson import TRACES_FILE, read_spans

#: the workers sample every 5 ms in cycles of 200 ms; the scheduler profiles
PROFILED_ENV = {
    "DASK_OTEL_SPANS__PROFILE__ENABLED": "true",
    "DASK_DISTRIBUTED__WORKER__PROFILE__INTERVAL": "5ms",
    "DASK_DISTRIBUTED__WORKER__PROFILE__CYCLE": "200ms",
}


def inc(x: int) -> int:
    return x + 1


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, list[dict]]:
    """The workflow run once: its output directory and its spans."""
    cwd = tmp_path_factory.mktemp("profiled")
    procs = DaskProcesses(PROFILED_ENV, cwd=str(cwd))
    try:
        with Client(procs.address, timeout=60) as client:
            client.wait_for_workers(1, timeout=60)
            with span("workflow"):
                counts = client.map(hot_loop, [0.8, 0.8], pure=False)
                client.gather(client.map(inc, client.gather(counts)))
            state = wait_for_export(client, timeout=30)
            assert not state.open
    finally:
        procs.stop()
    out = cwd / "dask-otel-spans"
    return out, read_spans(str(out / TRACES_FILE))


def prefix_span(spans: list[dict], prefix: str) -> dict:
    (found,) = [s for s in spans if s["name"] == prefix
                and names.TASK_GROUP_COUNT in s["attributes"]]
    return found


@pytest.mark.cluster
def test_the_hot_prefix_span_names_hot_loop_first(run):
    _, spans = run
    attributes = prefix_span(spans, "hot_loop")["attributes"]
    assert attributes[names.PROFILE_TOP][0].startswith(
        f"hot_loop (workloads.py:{hot_loop.__code__.co_firstlineno}) ")
    assert attributes[names.PROFILE_SAMPLES] > 0
    assert names.PROFILE_SAMPLES not in prefix_span(spans, "inc")["attributes"]


#: Run in the page after its own scripts: open the hot_loop prefix span's row, read
#: its flame graph's frames, then click the hot_loop frame and read them again
CLICKS = """<script>
(function(){
  function frames(){
    return Array.prototype.map.call(document.querySelectorAll("#flame .frame"),
      function(f){return {name: f.dataset.name, path: f.dataset.path,
        total: +f.dataset.total, own: +f.dataset.own, title: f.title,
        width: parseFloat(f.style.width), above: f.classList.contains("above")};});}
  document.getElementById("row-%(row)s").click();
  document.body.setAttribute("data-flame", JSON.stringify(frames()));
  document.querySelector('#flame .frame[data-name="hot_loop"]').click();
  document.body.setAttribute("data-zoomed", JSON.stringify(frames()));
  document.body.setAttribute("data-focus", document.getElementById("flame").dataset.focus);
})();
</script>"""


@pytest.fixture(scope="module")
def page(run, tmp_path_factory) -> str:
    """The report's DOM after the clicks, as headless Chromium dumps it."""
    out, spans = run
    where = tmp_path_factory.mktemp("browser")
    saved = Path(Report([str(out)]).save(str(where / "report.html")))
    row = prefix_span(spans, "hot_loop")["spanId"]
    saved.write_text(saved.read_text().replace("</body>", CLICKS % {"row": row} + "</body>"))
    return browser.dump_dom(browser.probed_copy(saved, where))


def ancestor(path: str, of: str) -> bool:
    return path == "" or of.startswith(path + ".")


@pytest.mark.cluster
def test_the_flame_graph_opens_with_hot_loop_widest_below_the_task_entry(page):
    assert json.loads(browser.body_attribute(page, "data-probe-errors")) == []
    frames = json.loads(browser.body_attribute(page, "data-flame"))
    (hot,) = [f for f in frames if f["name"] == "hot_loop"]
    # every frame as wide as hot_loop or wider is one it ran below (the entry)
    for f in frames:
        if f["total"] >= hot["total"] and f is not hot:
            assert ancestor(f["path"], hot["path"]), f
    assert hot["own"] >= 0.8 * hot["total"]
    assert f"{hot['total']} samples" in hot["title"]


@pytest.mark.cluster
def test_a_click_on_a_frame_zooms_the_flame_graph_to_it(page):
    assert browser.body_attribute(page, "data-focus") == "hot_loop"
    zoomed = json.loads(browser.body_attribute(page, "data-zoomed"))
    (hot,) = [f for f in zoomed if f["name"] == "hot_loop"]
    assert hot["width"] == 100 and not hot["above"]
    assert all(f["above"] for f in zoomed if ancestor(f["path"], hot["path"]))
