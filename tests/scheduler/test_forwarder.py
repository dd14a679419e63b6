"""The forwarder: what it sends of spans, graphs, close notices, task groups and
heartbeat deltas, without a cluster (real ``Span`` objects, task groups and tasks
standing in for the scheduler's)."""
from __future__ import annotations

from typing import Any

import pytest
from distributed.spans import Span
from support.stand_ins import Prefix, Recorder, Task, TaskGroup

from dask_otel_spans.protocol.dask_private import code_snippets, cumulative_metrics
from dask_otel_spans.protocol.events import (
    CLIENT_GONE,
    CONTEXTS,
    GRAPH,
    NOTICE,
    Dispatcher,
)
from dask_otel_spans.scheduler import forwarder as forwarder_module
from dask_otel_spans.scheduler.forwarder import SpanForwarder


def task_group(name: str, span_id: str, running: int = 1, memory: int = 0) -> TaskGroup:
    """The task group ``name`` of the span ``span_id``, ``running`` of its tasks
    processing and ``memory`` in memory."""
    return TaskGroup(Prefix(name.split("-")[0]), start=1.0, stop=2.0, nbytes_total=28,
                     duration=0.5,
                     states={"processing": running, "memory": memory, "erred": 0},
                     name=name, span_id=span_id)


class Sink:
    """The transport's side: what was sent, in order."""

    def __init__(self) -> None:
        self.items: list[tuple[Any, ...]] = []

    def send(self, messages: list) -> None:
        self.items += messages

    @property
    def events(self) -> list[tuple[Any, ...]]:
        return [item for item in self.items if item[0] in (GRAPH, NOTICE, CLIENT_GONE)]


HISTORY = [(0.0, 4)]


@pytest.fixture
def tree() -> dict[str, Span]:
    root = Span(("root",), "r", None, HISTORY)
    child = Span(("root", "child"), "c", root, HISTORY)
    root.children.append(child)
    return {"r": root, "c": child}


@pytest.fixture
def sink() -> Sink:
    return Sink()


def forwarder_of(spans: dict, sink: Sink, tasks: dict | None = None,
                 **kwargs: Any) -> SpanForwarder:
    """A forwarder that knows none of ``spans`` yet (as if they were made after it
    started); the hooks' events happen at time 10.0 (unless ``clock`` says)."""
    known = dict(spans)
    spans.clear()
    kwargs.setdefault("clock", lambda: 10.0)
    forwarder = SpanForwarder(spans, tasks or {}, sink, **kwargs)
    spans.update(known)
    return forwarder


def annotations(otel: Any, callers: Any) -> dict[str, Any]:
    """The graph annotations the scheduler passes ``update_graph``: the client
    helper's chains (``otel``) and the callers of bare submissions."""
    out = {}
    if otel is not None:
        out["otel"] = otel
    if callers is not None:
        out["otel-caller"] = callers
    return out


def touch(forwarder: SpanForwarder, group: TaskGroup, finish: str = "processing",
          start: str = "waiting", **kwargs: Any) -> None:
    """What the ``transition`` hook tells the forwarder of a task of ``group`` that
    started (or, with ``finish``, settled): a task of the scheduler's task dict."""
    key = f"{group.name}-{len(forwarder.tasks)}"
    forwarder.tasks[key] = Task(group)
    forwarder.task_moved(key, start, finish, kwargs)


def test_new_spans_are_forwarded_once_with_their_chain_in_creation_order(tree, sink):
    forwarder = forwarder_of(tree, sink)
    forwarder.tick(2)
    forwarder.tick(2)
    spans = [item for item in sink.items if item[0] == "span"]
    assert [(s[1], s[2]) for s in spans] == [
        (("r",), ("root",)), (("r", "c"), ("root", "child"))
    ]


def test_worker_count_is_forwarded_when_it_changes(tree, sink):
    forwarder = forwarder_of(tree, sink)
    for n in (2, 2, 3):
        forwarder.tick(n)
    assert [item for item in sink.items if item[0] == "workers"] == [
        ("workers", 2), ("workers", 3)
    ]


def test_a_graph_is_forwarded_as_the_ids_of_its_spans_and_its_distinct_chains(tree, sink):
    group = task_group("inc-1", "c")
    tasks = {("inc-1", 0): Task(group), ("inc-1", 1): Task(group)}
    forwarder = forwarder_of(tree, sink, tasks)
    chain = {"r": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, "c": {}}
    otel = {("inc-1", 0): chain, ("inc-1", 1): chain}
    forwarder.graph_submitted("client-1", list(tasks), annotations(otel, None))
    forwarder.tick(2)
    assert sink.events == [("graph", 10.0, "client-1", ["c"], [chain], [], [])]
    assert forwarder.idle(2)


CALLER = {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "baggage": "k=v"}


def test_a_bare_submission_links_the_span_its_tasks_landed_in_to_its_caller(tree, sink):
    group = task_group("inc-1", "c")
    tasks = {("inc-1", i): Task(group) for i in range(600)}
    forwarder = forwarder_of(tree, sink, tasks)
    callers = dict.fromkeys(tasks, CALLER)  # (dask shares the global annotation)
    forwarder.graph_submitted(None, list(tasks), annotations(None, callers))
    forwarder.tick(2)
    (graph,) = sink.events
    # once, W3C headers only: baggage goes to the workers, not into the link
    assert graph[-1] == [("c", {"traceparent": CALLER["traceparent"]})]


def test_tasks_forgotten_by_the_tick_link_the_default_span_of_their_graph(tree, sink):
    default = Span(("default",), "d", None, HISTORY)
    forwarder = forwarder_of(tree, sink, {}, by_name={("default",): [default]})
    callers = {("inc-1", 0): CALLER}
    forwarder.graph_submitted(None, list(callers), annotations(None, callers))
    forwarder.tick(2)
    assert sink.events[0][-1] == [("d", {"traceparent": CALLER["traceparent"]})]


def test_tasks_of_a_span_block_link_to_no_caller(tree, sink):
    group = task_group("inc-1", "c")
    tasks = {("inc-1", 0): Task(group)}
    forwarder = forwarder_of(tree, sink, tasks)
    otel = {("inc-1", 0): {"c": {}}}
    callers = {("inc-1", 0): CALLER}  # (the block's baggage)
    forwarder.graph_submitted(None, list(tasks), annotations(otel, callers))
    forwarder.tick(2)
    assert sink.events[0][-1] == []


def test_a_malformed_caller_links_to_nothing(tree, sink):
    group = task_group("inc-1", "c")
    tasks = {("inc-1", 0): Task(group), ("inc-1", 1): Task(group)}
    forwarder = forwarder_of(tree, sink, tasks)
    callers = {("inc-1", 0): "not a carrier", ("inc-1", 1): {"traceparent": 7}}
    forwarder.graph_submitted(None, list(tasks), annotations(None, callers))
    forwarder.tick(2)
    assert sink.events[0][-1] == []


def test_an_idle_forwarder_has_nothing_to_send(tree, sink):
    forwarder = forwarder_of(tree, sink)
    forwarder.tick(2)
    sent = len(sink.items)
    assert forwarder.idle(2)
    forwarder.tick(2)
    assert len(sink.items) == sent


@pytest.mark.parametrize("change", ["span", "event", "group", "error", "workers"])
def test_a_forwarder_is_not_idle_while_a_tick_would_send_something(tree, sink, change):
    forwarder = forwarder_of(tree, sink)
    forwarder.tick(2)
    n_workers = 2
    if change == "span":
        tree["d"] = Span(("root", "d"), "d", tree["r"], HISTORY)
    elif change == "event":
        forwarder.client_gone("client-1")
    elif change == "group":
        touch(forwarder, task_group("inc-1", "c"))
    elif change == "error":
        touch(forwarder, task_group("inc-1", "c"), "erred")
    else:
        n_workers = 3
    sent = len(sink.items)
    assert not forwarder.idle(n_workers)
    forwarder.tick(n_workers)
    assert len(sink.items) > sent
    assert forwarder.idle(n_workers)


def test_notices_and_departed_clients_are_forwarded_as_they_came(tree, sink):
    forwarder = forwarder_of(tree, sink)
    notice = {"ids": ["r"], "name": ["root"], "opened": 1, "enter": 1, "exit": 2}
    forwarder.close_notice(notice)
    forwarder.client_gone("client-1")
    forwarder.tick(2)
    assert sink.events == [("notice", 10.0, notice), ("client-gone", 10.0, "client-1")]


def test_a_touched_group_is_forwarded_running_then_done_with_its_figures(tree, sink):
    group = task_group("inc-1", "c")
    forwarder = forwarder_of(tree, sink)
    touch(forwarder, group)
    forwarder.tick(2)
    group.states.update(processing=0, memory=1)
    touch(forwarder, group)
    forwarder.tick(2)
    groups = [item for item in sink.items if item[0] in ("run", "done")]
    assert groups == [
        ("run", "c", id(group), "inc"),
        ("done", "c", id(group), ("inc", 1.0, 2.0, 28, 0.5, 1, 0, 0.0, 0.0)),
    ]


def test_a_done_group_carries_the_compute_times_of_its_erred_tasks(tree, sink):
    """Under ``task-spans: none`` too: dask's TaskGroup counts them in no
    ``start`` or ``stop``; the transition hook hands them to the sampler."""
    group = task_group("div-1", "c", running=0, memory=0)
    group.start = group.stop = 0.0  # (no task of it finished)
    forwarder = forwarder_of(tree, sink)  # (its sampler keeps no task)
    for start, stop in [(3.0, 3.5), (2.5, 3.2)]:
        touch(forwarder, group, "erred", "processing", startstops=[
            {"action": "compute", "start": start, "stop": stop}])
    forwarder.tick(2)
    (done,) = [item for item in sink.items if item[0] == "done"]
    assert done[3][1:3] == (0.0, 0.0) and done[3][-2:] == (2.5, 3.5)
    assert forwarder.sampler.erred_windows == {}


def test_a_group_touched_many_times_in_a_tick_is_forwarded_once(tree, sink):
    group = task_group("inc-1", "c", running=0, memory=3)
    forwarder = forwarder_of(tree, sink)
    for _ in range(3):
        touch(forwarder, group, "memory", "processing")
    forwarder.tick(2)
    assert [item[0] for item in sink.items if item[0] in ("run", "done")] == ["done"]


def test_adoption_forwards_running_spans_with_ancestors_groups_and_metrics(sink):
    root = Span(("root",), "r", None, HISTORY)
    running = Span(("root", "running"), "a", root, HISTORY)
    finished = Span(("old",), "o", None, HISTORY)
    running.groups.add(task_group("inc-1", "a"))
    finished.groups.add(task_group("inc-2", "o", running=0, memory=1))
    cumulative_metrics(running)[("execute", "inc", "thread-cpu", "seconds")] = 2.0
    spans = {"r": root, "a": running, "o": finished}
    forwarder = SpanForwarder(spans, {}, sink)
    for _ in forwarder.adopt():
        pass
    assert [item[0] for item in sink.items] == [
        "span", "span", "run", "counts", "metrics"]
    assert sink.items[0][1] == ("r",) and sink.items[1][1] == ("r", "a")
    assert sink.items[4] == (
        "metrics", "a", {("execute", "inc", "thread-cpu", "seconds"): 2.0}
    )


def test_adoption_for_a_new_process_forwards_again_the_done_spans_not_handed_over(
        sink):
    done = [Span((f"s{i}",), f"s{i}", None, HISTORY) for i in range(4)]
    for i, span in enumerate(done):
        span.groups.add(task_group(f"inc-{i}", span.id, running=0, memory=1))
    child = Span(("s3", "child"), "c", done[3], HISTORY)  # done too, its parent as well
    child.groups.add(task_group("inc-c", "c", running=0, memory=1))
    spans = {span.id: span for span in [*done, child]}
    forwarder = forwarder_of(spans, sink)
    forwarder.tick(1)  # (forwarded to the process that died)
    sink.items.clear()
    for _ in forwarder.adopt(handed_over={0, 2, 4}):
        pass
    # the spans at places 1 and 3, alone, each with its place and its done group
    assert [(item[1], item[5]) for item in sink.items if item[0] == "span"] == [
        (("s1",), 1), (("s3",), 3)
    ]
    assert [item[:2] for item in sink.items if item[0] == "done"] == [
        ("done", "s1"), ("done", "s3")
    ]


def test_adoption_for_a_new_process_leaves_out_what_was_done_before_the_forwarder(
        sink):
    span = Span(("s",), "s", None, HISTORY)
    span.groups.add(task_group("inc-1", "s", running=0, memory=1))
    forwarder = SpanForwarder({"s": span}, {}, sink)
    for _ in forwarder.adopt(handed_over=set()):
        pass
    assert sink.items == []


def test_adopted_ancestors_carry_their_place(sink):
    root = Span(("root",), "r", None, HISTORY)  # (no group of its own: done)
    running = Span(("root", "running"), "a", root, HISTORY)
    running.groups.add(task_group("inc-1", "a"))
    forwarder = SpanForwarder({"r": root, "a": running}, {}, sink)
    for _ in forwarder.adopt():
        pass
    assert [(item[1], item[5]) for item in sink.items if item[0] == "span"] == [
        (("r",), 0), (("r", "a"), 1)
    ]


def test_an_adoption_forwards_again_the_contexts_its_spans_tasks_carried(tree, sink):
    """A new export process learns the contexts the client helper's blocks carried
    for the spans it adopts (their trees' traces), from the tasks the scheduler
    holds: each distinct chain once, after the spans."""
    chain = {"r": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-"
                                  "b7ad6b7169203331-01"}, "c": {}}
    group = task_group("inc-1", "c")
    tree["c"].groups.add(group)
    tasks = {
        "inc-1": Task(group, annotations={"span": {"ids": ("r", "c")}, "otel": chain}),
        "inc-2": Task(group, annotations={"span": {"ids": ("r", "c")}, "otel": chain}),
        "other": Task(group, annotations={"otel": {"elsewhere": {}}}),
        "plain": Task(group),
    }
    forwarder = SpanForwarder(tree, tasks, sink, clock=lambda: 10.0)
    for _ in forwarder.adopt():
        pass
    assert sink.items[-1] == (CONTEXTS, [chain])
    assert [item[0] for item in sink.items].count(CONTEXTS) == 1


def test_adoption_at_start_leaves_done_spans_out(sink):
    span = Span(("s",), "s", None, HISTORY)
    span.groups.add(task_group("inc-1", "s", running=0, memory=1))
    forwarder = SpanForwarder({"s": span}, {}, sink)
    for _ in forwarder.adopt():
        pass
    assert sink.items == []


def test_new_spans_carry_their_place_in_the_span_dict(tree, sink):
    forwarder = forwarder_of(tree, sink)
    forwarder.tick(2)
    assert [item[5] for item in sink.items if item[0] == "span"] == [0, 1]


def test_spans_of_before_the_forwarder_are_left_to_adoption(tree, sink):
    forwarder = SpanForwarder(tree, {}, sink)
    forwarder.tick(2)
    assert [item for item in sink.items if item[0] == "span"] == []


def test_a_new_copy_is_told_the_worker_count_after_adoption(tree, sink):
    forwarder = forwarder_of(tree, sink)
    forwarder.tick(2)
    sink.items.clear()
    for _ in forwarder.adopt():  # (a new export process: it knows nothing)
        pass
    forwarder.tick(2)
    assert ("workers", 2) in sink.items


def test_a_tick_pauses_every_step_and_forwards_all(sink):
    spans = {f"s{i}": Span((f"s{i}",), f"s{i}", None, HISTORY) for i in range(600)}
    forwarder = forwarder_of(spans, sink)
    pauses = sum(1 for _ in forwarder.tick_steps(2))
    assert pauses >= 2
    assert [item[5] for item in sink.items if item[0] == "span"] == list(range(600))


def test_a_span_made_during_a_pause_is_forwarded_before_its_group(sink):
    spans = {f"s{i}": Span((f"s{i}",), f"s{i}", None, HISTORY) for i in range(300)}
    forwarder = forwarder_of(spans, sink)
    steps = forwarder.tick_steps(2)
    next(steps)  # paused after the first spans
    late = Span(("late",), "late", None, HISTORY)
    spans["late"] = late
    group = task_group("inc-9", "late", running=0, memory=1)
    touch(forwarder, group)
    for _ in steps:
        pass
    forwarder.tick(2)  # (what the hooks told it during the tick: the next tick's)
    kinds = [(item[0], item[1]) for item in sink.items if item[0] in ("span", "done")]
    assert kinds.index(("span", ("late",))) < kinds.index(("done", "late"))


def test_spans_a_heartbeat_forwarded_during_a_pause_are_not_forwarded_again(sink):
    spans = {f"s{i}": Span((f"s{i}",), f"s{i}", None, HISTORY) for i in range(600)}
    forwarder = forwarder_of(spans, sink)
    steps = forwarder.tick_steps(2)
    next(steps)
    forwarder.forward_deltas({})  # (the heartbeat wrapper: the spans, then deltas)
    for _ in steps:
        pass
    assert [item[5] for item in sink.items if item[0] == "span"] == list(range(600))


def test_a_group_still_running_is_not_forwarded_again_at_each_tick(tree, sink):
    group = task_group("inc-1", "c")
    forwarder = forwarder_of(tree, sink)
    for _ in range(3):  # tasks of the group start and settle, tick after tick
        touch(forwarder, group)
        forwarder.tick(2)
    group.states.update(processing=0, memory=5)
    touch(forwarder, group)
    forwarder.tick(2)
    assert [item[0] for item in sink.items if item[0] in ("run", "done")] == [
        "run", "done"
    ]
    assert forwarder.forwarded.running == {}


def test_a_group_that_runs_again_after_it_was_done_is_forwarded_running_again(
    tree, sink
):
    group = task_group("inc-1", "c")
    forwarder = forwarder_of(tree, sink)
    for running, memory in ((1, 0), (0, 1), (1, 1), (0, 2)):
        group.states.update(processing=running, memory=memory)
        touch(forwarder, group)
        forwarder.tick(2)
    assert [item[0] for item in sink.items if item[0] in ("run", "done")] == [
        "run", "done", "run", "done"
    ]


def test_after_an_adoption_a_running_group_is_forwarded_running_again(tree, sink):
    group = task_group("inc-1", "c")
    forwarder = forwarder_of(tree, sink)
    touch(forwarder, group)
    forwarder.tick(2)
    for _ in forwarder.adopt():  # (a new export process; the group is not in the
        pass                     # span's groups here, so adoption does not send it)
    sink.items.clear()
    touch(forwarder, group)
    forwarder.tick(2)
    assert ("run", "c", id(group), "inc") in sink.items


def test_a_tick_pauses_among_many_groups_it_need_not_forward(sink):
    spans = {"s": Span(("s",), "s", None, HISTORY)}
    groups = [task_group(f"inc-{i}", "s") for i in range(600)]
    forwarder = forwarder_of(spans, sink)
    for group in groups:
        touch(forwarder, group)
    forwarder.tick(2)
    for group in groups:  # still running: nothing to forward
        touch(forwarder, group)
    pauses = sum(1 for _ in forwarder.tick_steps(2))
    assert pauses >= 2
    assert len([item for item in sink.items if item[0] == "run"]) == 600


def test_an_adoption_counts_the_spans_it_forwards_to_the_new_process(tree, sink):
    forwarder = forwarder_of(tree, sink)
    forwarder.tick(2)  # both spans, to the first export process
    for span in tree.values():
        span.groups.add(task_group(f"inc-{span.id}", span.id))  # still running
    for _ in forwarder.adopt():  # a second export process
        pass
    assert forwarder.forwarded.spans == 4
    # what the second one was sent: the 2 running spans, again
    assert forwarder.forwarded_to_this_copy == 2


def test_a_running_group_an_adoption_sent_is_not_sent_again_while_it_runs(sink):
    span = Span(("s",), "s", None, HISTORY)
    group = task_group("inc-1", "s")
    span.groups.add(group)
    forwarder = SpanForwarder({"s": span}, {}, sink)
    for _ in forwarder.adopt():
        pass
    touch(forwarder, group)  # a task of it started or settled: still running
    forwarder.tick(2)
    assert [item[0] for item in sink.items if item[0] in ("run", "done")] == ["run"]


def test_deltas_are_forwarded_after_the_spans_they_name(tree, sink):
    forwarder = forwarder_of(tree, sink)
    deltas = {("execute", "c", "inc", "thread-cpu", "seconds"): 1.5}
    forwarder.forward_deltas(deltas)
    assert [item[0] for item in sink.items] == ["span", "span", "deltas"]
    assert sink.items[-1] == ("deltas", deltas)


def test_deltas_of_a_heartbeat_before_the_tick_go_after_the_graph_waiting_for_it(
        tree, sink):
    """A heartbeat between ``update_graph`` and the next tick: its deltas follow the
    graph, whose contexts the export side needs for their exemplars."""
    group = task_group("inc-1", "c")
    tasks = {("inc-1", 0): Task(group)}
    forwarder = forwarder_of(tree, sink, tasks)
    chain = {"r": {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, "c": {}}
    forwarder.graph_submitted("client-1", list(tasks),
                              annotations({("inc-1", 0): chain}, None))
    deltas = {("execute", "c", "inc", "thread-cpu", "seconds"): 1.5}
    forwarder.forward_deltas(deltas)
    assert sink.items == []
    forwarder.tick(2)
    kinds = [item[0] for item in sink.items]
    assert kinds.index("span") < kinds.index("graph") < kinds.index("deltas")
    assert sink.items[-1] == ("deltas", deltas)


def test_deltas_of_a_heartbeat_during_a_tick_go_after_its_graphs(tree, sink):
    """A heartbeat while a tick reads a large graph in steps: its deltas follow it."""
    group = task_group("inc-1", "c")
    tasks = {("inc-1", i): Task(group)
             for i in range(3 * forwarder_module.SPANS_PER_STEP)}
    forwarder = forwarder_of(tree, sink, tasks)
    forwarder.graph_submitted("client-1", list(tasks), annotations(None, None))
    steps = forwarder.tick_steps(2)
    next(steps)
    while "span" not in [item[0] for item in sink.items]:
        next(steps)
    next(steps)  # (in the graph's keys now)
    forwarder.forward_deltas({("execute", "c", "inc", "x", "count"): 1})
    for _ in steps:
        pass
    forwarder.tick(2)
    kinds = [item[0] for item in sink.items]
    assert kinds.index("graph") < kinds.index("deltas")


def test_two_groups_of_one_name_in_a_span_are_told_apart(tree, sink):
    """A task group forgotten, and a new one of the same name in the same span (as
    a second ``submit`` of ``inc`` after the first's results were released)."""
    first, second = task_group("inc", "c", running=0, memory=1), task_group("inc", "c")
    tree["c"].groups.update((first, second))
    forwarder = forwarder_of(tree, sink)
    touch(forwarder, first)
    touch(forwarder, second)
    forwarder.tick(2)
    sent = {item[2] for item in sink.items if item[0] in ("run", "done")}
    assert sent == {id(first), id(second)}


def test_code_is_forwarded_once_per_snippet_with_include_code(tree, sink):
    code_snippets(tree["c"])[("snippet-1",)] = None
    group = task_group("inc-1", "c")
    tasks = {"inc-1": Task(group)}
    forwarder = forwarder_of(tree, sink, tasks, include_code=True)
    for _ in range(2):
        forwarder.graph_submitted(None, ["inc-1"], annotations(None, None))
        forwarder.tick(2)
    code_snippets(tree["c"])[("snippet-2",)] = None
    forwarder.graph_submitted(None, ["inc-1"], annotations(None, None))
    forwarder.tick(2)
    assert [item for item in sink.items if item[0] == "code"] == [
        ("code", "c", (("snippet-1",),)), ("code", "c", (("snippet-2",),)),
    ]


def test_the_code_counted_is_of_the_latest_spans_only(tree, sink, monkeypatch):
    monkeypatch.setattr(forwarder_module, "MAX_CODE_COUNTED", 2)
    tasks = {}
    for n in range(5):
        span = tree[f"s{n}"] = Span((f"step-{n}",), f"s{n}", None, HISTORY)
        code_snippets(span)[(f"snippet-{n}",)] = None
        tasks[f"inc-{n}"] = Task(task_group(f"inc-{n}", f"s{n}"))
    forwarder = forwarder_of(tree, sink, tasks, include_code=True)
    for n in range(5):
        forwarder.graph_submitted(None, [f"inc-{n}"], annotations(None, None))
    forwarder.tick(2)
    assert [item[1] for item in sink.items if item[0] == "code"] == [
        f"s{n}" for n in range(5)]
    assert list(forwarder.forwarded.code) == ["s3", "s4"]


def test_every_message_the_forwarder_sends_is_of_the_protocol(tree, sink):
    group = task_group("inc-1", "c")
    tasks = {"inc-1": Task(group)}
    forwarder = forwarder_of(tree, sink, tasks, include_code=True)
    code_snippets(tree["c"])[("snippet",)] = None
    tree["c"].groups.add(group)
    cumulative_metrics(tree["c"])[("execute", "inc", "x", "count")] = 1
    forwarder.graph_submitted("c1", ["inc-1"], annotations({"inc-1": {"c": {}}}, None))
    forwarder.close_notice({"ids": ["c"]})
    forwarder.client_gone("c1")
    touch(forwarder, group)
    forwarder.tick(2)
    forwarder.forward_deltas({("execute", "c", "inc", "x", "count"): 1})
    for _ in forwarder.adopt():
        pass
    recorder = Recorder()
    dispatch = Dispatcher(recorder)
    for message in sink.items:
        dispatch(message)
    assert {name for name, _ in recorder.calls} == {
        "on_worker_count", "on_span_added", "on_graph_submitted", "on_close_notice",
        "on_client_gone", "on_group_running", "on_group_counts", "on_span_deltas",
        "on_span_code", "on_span_metrics",
    }


def test_errors_are_forwarded_as_they_were_counted_before_the_groups(tree, sink):
    group = task_group("div-1", "c", running=0, memory=0)
    forwarder = forwarder_of(tree, sink)
    for _ in range(3):  # (the transition hook counts tasks that err)
        touch(forwarder, group, "erred")
    forwarder.tick(2)
    kinds = [item[0] for item in sink.items if item[0] in ("erred", "done")]
    assert kinds == ["erred", "done"]
    assert ("erred", "c", id(group), 3, []) in sink.items
    assert forwarder.idle(2)


def test_the_exception_classes_of_erred_tasks_go_with_their_count(tree, sink):
    group = task_group("div-1", "c", running=0, memory=0)
    forwarder = forwarder_of(tree, sink)
    for text in ("ZeroDivisionError('a')", "ZeroDivisionError('a')", "KeyError(1)"):
        touch(forwarder, group, "erred", "processing", exception_text=text)
    forwarder.tick(2)
    (erred,) = [item for item in sink.items if item[0] == "erred"]
    assert sorted(erred[4]) == [(None, "KeyError", 1), (None, "ZeroDivisionError", 2)]
    assert forwarder.sampler.erred_classes == {}


# -- the running groups' tasks by state (scheduler/counts.py) --------------------------

def counts_sent(sink: Sink) -> list[tuple[Any, ...]]:
    """The entries of the ``counts`` messages, in order."""
    return [entry for item in sink.items if item[0] == "counts" for entry in item[1]]


def test_a_running_group_handled_at_a_tick_sends_its_counts_after_its_run(tree, sink):
    group = task_group("inc-1", "c", running=2, memory=1)
    group.states.update(waiting=3, queued=1)
    forwarder = forwarder_of(tree, sink)
    touch(forwarder, group)
    forwarder.tick(2)
    kinds = [item[0] for item in sink.items if item[0] in ("run", "counts")]
    assert kinds == ["run", "counts"]
    # (span, group, total, erred, running, waiting)
    assert counts_sent(sink) == [("c", id(group), 7, 0, 2, 4)]


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_counts_that_did_not_change_are_not_sent_again(tree, sink):
    clock = Clock()
    group = task_group("inc-1", "c")
    forwarder = forwarder_of(tree, sink, clock=clock)
    for _ in range(3):
        touch(forwarder, group)
        forwarder.tick(2)
        clock.now += 1.0
    assert len(counts_sent(sink)) == 1


def test_a_running_groups_counts_wait_for_the_sweep_whatever_moved(tree, sink):
    clock = Clock()
    group = task_group("inc-1", "c", running=2)
    forwarder = forwarder_of(tree, sink, clock=clock)
    touch(forwarder, group)
    forwarder.tick(2)
    group.states.update(processing=1, memory=1)
    touch(forwarder, group, "memory", "processing")  # (a task settled)
    forwarder.tick(2)
    assert len(counts_sent(sink)) == 1
    clock.now += 1.0
    forwarder.tick(2)
    assert counts_sent(sink)[-1] == ("c", id(group), 2, 0, 1, 0)


def test_tasks_that_start_while_nothing_settles_are_counted_at_the_next_sweep(
    tree, sink
):
    clock = Clock()
    group = task_group("inc-1", "c", running=1)
    group.states["queued"] = 3
    forwarder = forwarder_of(tree, sink, clock=clock, live_interval=0.5)
    touch(forwarder, group)
    forwarder.tick(2)
    group.states.update(processing=2, queued=2)  # (no hook call: nothing settled)
    clock.now += 0.4
    assert forwarder.idle(2)
    clock.now += 0.1
    assert not forwarder.idle(2)
    forwarder.tick(2)
    assert counts_sent(sink)[-1] == ("c", id(group), 4, 0, 2, 2)
    assert forwarder.idle(2)


def test_the_sweep_comes_every_second_at_most(tree, sink):
    clock = Clock()
    group = task_group("inc-1", "c")
    forwarder = forwarder_of(tree, sink, clock=clock, live_interval=30.0)
    touch(forwarder, group)
    forwarder.tick(2)
    clock.now += 1.0
    assert not forwarder.idle(2)


def test_a_group_done_leaves_the_sweep(tree, sink):
    clock = Clock()
    group = task_group("inc-1", "c")
    forwarder = forwarder_of(tree, sink, clock=clock)
    touch(forwarder, group)
    forwarder.tick(2)
    group.states.update(processing=0, memory=1)
    touch(forwarder, group, "memory", "processing")
    forwarder.tick(2)
    clock.now += 5.0
    assert forwarder.forwarded.running == {} and forwarder.idle(2)
