"""The report's model from OTLP-JSON spans (pure): rows in tree order at their depth,
kinds, the exception of an erred span, activity breakdowns in dask's order, task spans
folded past the bound, the summary."""
from __future__ import annotations

from dask_otel_spans import names
from dask_otel_spans.reports.model import (
    CLIENT,
    DASK,
    FOLDED,
    IN_TASK,
    PREFIX,
    TASK,
    breakdown,
    build,
    kind_of,
)

TRACE = "0af7651916cd43dd8448eb211c80319c"


def span(span_id: str, parent: str = "", start: int = 0, end: int = 10, *,
         attributes=None, resource=None, events=(), status=None, name=None,
         file=None) -> dict:
    out = {"traceId": TRACE, "spanId": span_id, "parentSpanId": parent,
           "name": name or span_id, "startTimeUnixNano": str(start * 1_000_000),
           "endTimeUnixNano": str(end * 1_000_000), "attributes": attributes or {},
           "resource": resource or {}, "events": list(events), "status": status or {}}
    if file is not None:
        out["file"] = file
    return out


def dask_span(span_id, parent="", **kw):
    return span(span_id, parent, attributes={names.SPAN_ID: span_id,
                                             names.SPAN_TASK_COUNT: 3,
                                             names.SPAN_ERRED_COUNT: 1,
                                             **kw.pop("attributes", {})}, **kw)


def prefix_span(span_id, parent):
    return span(span_id, parent, attributes={names.TASK_PREFIX: "inc",
                                             names.TASK_GROUP_COUNT: 1})


def task_span(span_id, parent, start=1, end=2, erred=False):
    events = [{"name": names.EXCEPTION_EVENT, "attributes": [
        {"key": names.EXCEPTION_TYPE, "value": {"stringValue": "ValueError"}},
        {"key": names.EXCEPTION_MESSAGE, "value": {"stringValue": "boom"}}]}] if erred else ()
    return span(span_id, parent, start, end, events=events,
                attributes={names.TASK_KEY: span_id, names.TASK_PREFIX: "inc"})


def rows(data) -> list[tuple[str, str, int]]:
    return [(r["id"], r["kind"], r["depth"]) for r in data["traces"][0]["rows"]]


def test_a_span_of_a_workers_file_is_made_in_a_task_under_zero_code():
    """A bare submission's task under ``opentelemetry-instrument``: its span is the
    child of the caller's span, and the launcher's resource names no worker; its
    file (``workers/<name>-<pid>/``) says where it was made."""
    inner = span("w1", "c1", file="/run/dask-otel-spans/workers/w-7/traces.jsonl",
                 resource={"service.name": "unknown_service:python"})
    assert rows(build([span("c1"), inner])) == [("c1", CLIENT, 0), ("w1", IN_TASK, 1)]


def test_a_span_whose_resource_names_a_worker_is_made_in_a_task_with_the_preload():
    inner = span("w1", "c1", file="/collector/otel.json",
                 resource={names.WORKER_ADDRESS: "tcp://w:1"})
    assert rows(build([span("c1"), inner])) == [("c1", CLIENT, 0), ("w1", IN_TASK, 1)]


def test_a_span_of_another_process_s_file_is_client_code():
    app = span("c1", file="/run/dask-otel-spans/processes/app-3/traces.jsonl")
    assert kind_of(app) == CLIENT


def test_rows_come_in_tree_order_at_their_depth_with_their_kind():
    spans = [task_span("t1", "p1"), prefix_span("p1", "d2"), dask_span("d2", "d1", start=2),
             dask_span("d1", "c1", start=1), span("c1"),
             span("w1", "p1", 3, 4, resource={names.WORKER_ADDRESS: "tcp://w:1"})]
    assert rows(build(spans)) == [("c1", CLIENT, 0), ("d1", DASK, 1), ("d2", DASK, 2),
                                  ("p1", PREFIX, 3), ("t1", TASK, 4), ("w1", IN_TASK, 4)]


def test_times_are_relative_to_the_traces_start():
    data = build([span("a", start=5, end=9), span("b", "a", start=6, end=7)])
    (trace,) = data["traces"]
    assert trace["duration"] == 4.0
    assert [(r["start"], r["duration"]) for r in trace["rows"]] == [(0.0, 4.0), (1.0, 1.0)]


def test_an_erred_task_has_its_exception_and_a_logged_one_too():
    spans = [prefix_span("p", ""), task_span("t1", "p", erred=True), task_span("t2", "p")]
    logged = {(TRACE, "t2"): {names.EXCEPTION_TYPE: "KeyError",
                              names.EXCEPTION_MESSAGE: "'k'"}}
    errors = {r["id"]: r["error"] for r in build(spans, logged)["traces"][0]["rows"]}
    assert errors["t1"] == {"type": "ValueError", "message": "boom", "stacktrace": ""}
    assert errors["t2"]["type"] == "KeyError" and errors["p"] is None


def test_a_span_with_error_status_has_its_error_type_and_description():
    erred = dask_span("d", status={"code": 2, "message": "1 task erred: 1 ValueError"},
                      attributes={names.ERROR_TYPE: "ValueError"})
    (row,) = build([erred])["traces"][0]["rows"]
    assert row["error"] == {"type": "ValueError", "message": "1 task erred: 1 ValueError",
                            "stacktrace": ""}


def test_the_breakdown_follows_dasks_order_and_leaves_out_zeros():
    attrs = {f"dask.metrics.{a}.seconds": v for a, v in (
        ("transfer", 1.0), ("thread-cpu", 2.0), ("zzz-custom", 0.5), ("executor", 0.0),
        ("thread-noncpu", 0.25))}
    attrs["dask.metrics.transfer.bytes"] = 100
    assert breakdown(attrs) == [("thread-cpu", 2.0), ("thread-noncpu", 0.25),
                                ("transfer", 1.0), ("zzz-custom", 0.5)]


def test_task_spans_past_the_bound_fold_into_a_count_erred_and_slowest_first():
    tasks = [task_span(f"t{i}", "p", 1, 2 + i) for i in range(8)]
    tasks.append(task_span("bad", "p", erred=True))
    data = build([prefix_span("p", ""), *tasks], max_task_rows=3)
    shown = [r[0] for r in rows(data)]
    # (the kept rows stay in time order, as a waterfall shows them)
    assert shown[0] == "p" and set(shown[1:4]) == {"bad", "t7", "t6"}
    assert shown[4] == "p-folded"
    folded = data["traces"][0]["rows"][-1]
    assert (folded["kind"], folded["folded"], folded["name"]) == (
        FOLDED, 6, "6 more task spans")


def test_the_summary_counts_tasks_of_trees_once_and_lists_the_slowest():
    spans = [dask_span("root", end=50), dask_span("child", "root", end=20),
             span("other", end=1)]
    summary = build(spans)["summary"]
    assert (summary["traces"], summary["spans"], summary["tasks"], summary["erred"]) == (
        1, 3, 3, 1)
    assert [s["id"] for s in summary["slowest"]] == ["root", "child"]


def test_the_activity_colours_are_dasks_viridis_spread_over_the_activities_shown():
    from dask_otel_spans.reports.render import VIRIDIS11, activity_colours, interpolated

    assert interpolated(VIRIDIS11, len(VIRIDIS11)) == list(VIRIDIS11)
    assert interpolated(VIRIDIS11, 3) == ["#440154", "#208F8C", "#FDE724"]
    attrs = {"dask.metrics.transfer.seconds": 1.0, "dask.metrics.thread-cpu.seconds": 2.0,
             "dask.metrics.zzz.seconds": 0.5}
    colours = activity_colours(build([dask_span("d", attributes=attrs)]))
    assert colours == {"thread-cpu": "#440154", "transfer": "#208F8C", "zzz": "#FDE724"}


def test_a_span_below_a_prefix_span_is_made_in_a_task_whatever_its_resource():
    """(the launcher's providers on a worker put no worker address in the resource)"""
    spans = [prefix_span("p1", ""), span("w1", "p1", 3, 4), span("w2", "w1", 3, 4)]
    assert rows(build(spans)) == [("p1", PREFIX, 0), ("w1", IN_TASK, 1),
                                  ("w2", IN_TASK, 2)]


def test_a_root_whose_parent_is_elsewhere_names_it():
    data = build([dask_span("d1", "00f067aa0ba902b7"), prefix_span("p1", "d1")])
    assert [r["parent_elsewhere"] for r in data["traces"][0]["rows"]] == [
        "00f067aa0ba902b7", ""]


def test_the_activity_bars_share_one_scale_per_trace():
    seconds = names.METRICS_ATTRIBUTE_PREFIX + "thread-cpu.seconds"
    data = build([dask_span("d1", attributes={seconds: 4.0}),
                  dask_span("d2", "d1", attributes={seconds: 1.0})])
    assert data["traces"][0]["activity_scale"] == 4.0


def test_figures_that_are_not_finite_leave_the_breakdown_and_the_counts():
    nan, inf = float("nan"), float("inf")
    data = build([dask_span("a", attributes={
        names.SPAN_TASK_COUNT: nan, names.SPAN_ERRED_COUNT: inf,
        f"{names.METRICS_ATTRIBUTE_PREFIX}thread-cpu.seconds": inf,
        f"{names.METRICS_ATTRIBUTE_PREFIX}executor.seconds": nan,
        f"{names.METRICS_ATTRIBUTE_PREFIX}thread-noncpu.seconds": 0.5})])
    [row] = data["traces"][0]["rows"]
    assert row["breakdown"] == [("thread-noncpu", 0.5)]
    assert (data["summary"]["tasks"], data["summary"]["erred"]) == (0, 0)
