"""Dask's profile trees read: own time per function from distributed's counts (as
``distributed.profile.process`` records real frames), the hottest functions, the cap
on stacks, the wire form and the speedscope file. No cluster."""
from __future__ import annotations

import json
import marshal
import sys
import threading
from collections.abc import Callable

import pytest
from distributed import profile

from dask_otel_spans.protocol.profiles import (
    LEFT_OUT_NAME,
    SPEEDSCOPE_SCHEMA,
    Frame,
    Node,
    capped,
    from_stacks,
    from_wire,
    hottest,
    merged,
    own_by_function,
    read_tree,
    speedscope,
    stacks,
    to_wire,
)


def recorded(entry: Callable[[dict], None]) -> dict:
    """A profile tree as a worker records it (``process(frame, True, ...)``), of the
    samples ``entry`` takes with :func:`sample` in a thread of its own (the stack cut
    below the thread's start, as a worker cuts it below ``worker.py``)."""
    state = profile.create()
    thread = threading.Thread(target=entry, args=(state,))
    thread.start()
    thread.join()
    return state


def sample(state: dict) -> None:
    """One sample of the caller's stack, innermost frame the caller's."""
    profile.process(sys._getframe(1), True, state, stop="threading.py")


def hot(state, n):
    for _ in range(n):
        sample(state)


def cool(state, n):
    for _ in range(n):
        sample(state)


def caller_of_one(state):
    hot(state, 6)


def caller_of_two(state):
    hot(state, 3)
    cool(state, 2)


def caller_with_own_time(state):
    for _ in range(2):
        sample(state)
    hot(state, 3)


def names(root: Node) -> dict[str, int]:
    return {f.name: n for f, n in own_by_function(root).items()}


def test_a_leaf_function_gets_the_samples_that_sit_in_its_callers_count():
    raw = recorded(caller_of_one)
    # as distributed counts: the innermost frame's own samples are its caller's
    task = next(iter(raw["children"].values()))
    leaf = next(iter(task["children"].values()))
    assert (raw["count"], task["count"], leaf["count"]) == (6, 6, 0)
    assert names(read_tree(raw)) == {"hot": 6}


def test_two_leaf_functions_under_one_caller_are_not_told_apart():
    root = read_tree(recorded(caller_of_two))
    assert names(root) == {"hot | cool": 5}
    assert hottest(root, 5) == ["hot | cool (test_profile_trees.py) 100%"]
    (task,) = root.children.values()
    assert task.own == 0 and task.total == 5
    (unresolved,) = task.children.values()
    assert unresolved.unresolved and unresolved.own == 5


def test_a_caller_and_its_one_callee_split_the_samples():
    root = read_tree(recorded(caller_with_own_time))
    assert names(root) == {"caller_with_own_time": 2, "hot": 3}
    assert hottest(root, 5)[0].startswith("hot (test_profile_trees.py:")


def test_workers_read_one_by_one_then_merged_keep_each_attribution():
    root = merged([read_tree(recorded(caller_of_one)),
                   read_tree(recorded(caller_with_own_time))])
    assert root.total == 11
    assert names(root) == {"hot": 9, "caller_with_own_time": 2}


def test_top_says_function_file_line_and_share_of_all_samples():
    root = read_tree(recorded(caller_with_own_time))
    line = hot.__code__.co_firstlineno
    assert hottest(root, 5) == [f"hot (test_profile_trees.py:{line}) 60%",
                               f"caller_with_own_time (test_profile_trees.py:"
                               f"{caller_with_own_time.__code__.co_firstlineno}) 40%"]
    assert hottest(root, 1) == [f"hot (test_profile_trees.py:{line}) 60%"]


def test_a_recursive_function_counts_each_sample_once():
    def down(state, depth):
        if depth:
            down(state, depth - 1)
        else:
            sample(state)

    root = read_tree(recorded(lambda state: down(state, 3)))
    assert root.total == 1
    assert names(root) == {"down": 1}


def test_the_tree_keeps_total_as_own_plus_the_childrens_totals():
    root = merged([read_tree(recorded(caller_of_two)),
                   read_tree(recorded(caller_with_own_time))])
    todo = [root]
    while todo:
        node = todo.pop()
        assert node.total == node.own + sum(c.total for c in node.children.values())
        todo.extend(node.children.values())


def test_the_cap_keeps_the_heaviest_stacks_and_says_the_rest():
    f = [Frame(f"f{i}", "m.py", i) for i in range(5)]
    root = from_stacks([((f[0], f[i]), i) for i in range(1, 5)])
    kept, left_out = capped(root, 3)
    assert left_out == 2
    assert kept.total == root.total == 10
    assert sorted((tuple(x.name for x in p), n) for p, n in stacks(kept)) == [
        ((LEFT_OUT_NAME,), 3), (("f0", "f3"), 3), (("f0", "f4"), 4)]
    assert capped(root, 4) == (root, 0)


def test_malformed_trees_are_refused_with_a_value_error():
    for bad in ([], {"count": "x", "identifier": "root", "children": {}},
                {"count": 1, "identifier": "root", "children": [1]},
                {"count": 1, "children": {"a": {"count": 0, "children": {}}}}):
        with pytest.raises(ValueError):
            read_tree(bad)  # type: ignore[arg-type]


def test_a_tree_crosses_as_marshalled_plain_lists():
    root = read_tree(recorded(caller_of_two))
    back = from_wire(marshal.loads(marshal.dumps(to_wire(root))))
    assert to_wire(back) == to_wire(root)
    assert own_by_function(back) == own_by_function(root)
    with pytest.raises(ValueError):
        from_wire(["x", "", 0, 1])


def test_speedscope_file_holds_every_stack_with_its_samples():
    a = read_tree(recorded(caller_with_own_time))
    b = read_tree(recorded(caller_of_two))
    doc = json.loads(json.dumps(speedscope([("a", a), ("b", b)], "span", "test")))
    assert doc["$schema"] == SPEEDSCOPE_SCHEMA
    frames = doc["shared"]["frames"]
    assert all(isinstance(f["name"], str) for f in frames)
    for prof, root in zip(doc["profiles"], (a, b), strict=True):
        assert prof["type"] == "sampled" and prof["unit"] == "none"
        assert prof["endValue"] == sum(prof["weights"]) == root.total
        assert len(prof["samples"]) == len(prof["weights"])
        got = {tuple(frames[i]["name"] for i in s): w
               for s, w in zip(prof["samples"], prof["weights"], strict=True)}
        assert got == {tuple(f.name for f in p): n for p, n in stacks(root)}
    hot_frame = next(f for f in frames if f["name"] == "hot")
    assert hot_frame["line"] == hot.__code__.co_firstlineno
    assert hot_frame["file"].endswith("test_profile_trees.py")
