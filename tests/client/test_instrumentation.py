"""``DaskInstrumentor``: what ``instrument()`` changes (the dask config's preload lists,
explicit preload lists, ``distributed.span``) and that ``uninstrument()`` puts exactly
that back; ``dask_setup`` gives a server one plugin however often it is preloaded;
an instrumented process's ``Scheduler()`` gets one plugin. (Under the real launcher:
``processes/test_zero_code.py``.)"""
from __future__ import annotations

import logging
import sys
import warnings
from pathlib import Path

import dask
import distributed
import distributed.preloading
import distributed.spans
import pytest
from distributed import Nanny, Scheduler, Worker
from distributed.utils_test import gen_test

import dask_otel_spans
from dask_otel_spans import names
from dask_otel_spans.instrumentation import (
    PRELOAD,
    PRELOAD_KEYS,
    DaskInstrumentor,
    _instruments,
    with_preload,
)

PYPROJECT = Path(__file__).parent.parent.parent / "pyproject.toml"


@pytest.fixture
def instrumentor():
    """The instrumentor, off again after the test whatever happened in it."""
    instrumentor = DaskInstrumentor()
    assert not instrumentor.is_instrumented_by_opentelemetry
    yield instrumentor
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()


def preloads() -> dict[str, object]:
    return {key: dask.config.get(key) for key in PRELOAD_KEYS}


def test_the_entry_point_and_the_instruments_extra():
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # (the test extra's tomli)
        import tomli as tomllib

    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["entry-points"]["opentelemetry_instrumentor"] == {
        "dask": "dask_otel_spans.instrumentation:DaskInstrumentor"}
    assert tuple(project["optional-dependencies"]["instruments"]) == _instruments
    assert DaskInstrumentor().instrumentation_dependencies() == _instruments
    assert any(d.startswith("opentelemetry-distro")
               for d in project["optional-dependencies"]["test"])


def test_instrument_appends_the_preload_and_uninstrument_restores_the_config(
        instrumentor):
    with dask.config.set({"distributed.scheduler.preload": "theirs",
                          "distributed.worker.preload": ["a", "b"]}):
        before = preloads()
        instrumentor.instrument()
        assert preloads() == {"distributed.scheduler.preload": ["theirs", PRELOAD],
                              "distributed.worker.preload": ["a", "b", PRELOAD]}
        instrumentor.uninstrument()
        assert preloads() == before


def test_a_preload_there_already_is_neither_added_nor_removed(instrumentor):
    with dask.config.set({"distributed.scheduler.preload": [PRELOAD, "x"],
                          "distributed.worker.preload": []}):
        instrumentor.instrument()
        assert preloads() == {"distributed.scheduler.preload": [PRELOAD, "x"],
                              "distributed.worker.preload": [PRELOAD]}
        instrumentor.uninstrument()
        assert preloads() == {"distributed.scheduler.preload": [PRELOAD, "x"],
                              "distributed.worker.preload": []}


def test_uninstrument_keeps_a_setting_changed_in_between(instrumentor):
    """Only the entry it added goes: what the user set meanwhile stays."""
    with dask.config.set({"distributed.worker.preload": ["a"]}):
        instrumentor.instrument()
        dask.config.set({"distributed.worker.preload": ["a", PRELOAD, "later"]})
        instrumentor.uninstrument()
        assert dask.config.get("distributed.worker.preload") == ["a", "later"]


def test_distributed_span_is_the_package_span_while_instrumented(instrumentor):
    original = distributed.span, distributed.spans.span
    instrumentor.instrument()
    from distributed import span as imported_after

    assert distributed.span is dask_otel_spans.span
    assert distributed.spans.span is dask_otel_spans.span
    assert imported_after is dask_otel_spans.span
    # (and it still opens a dask span: the package's span wraps dask's own)
    with distributed.span("plain") as dask_id:
        annotations = dask.get_annotations()
        assert annotations["span"]["name"] == ("plain",)
        assert dask_id in annotations[names.ANNOTATION_KEY]
    instrumentor.uninstrument()
    assert (distributed.span, distributed.spans.span) == original


def test_uninstrument_keeps_a_later_patch(instrumentor):
    original = distributed.span
    instrumentor.instrument()

    def theirs(*tags):
        raise AssertionError

    distributed.span = theirs
    try:
        instrumentor.uninstrument()
        assert distributed.span is theirs
    finally:
        distributed.span = original


def test_a_wrapper_that_outlives_uninstrument_adds_nothing(instrumentor):
    """Someone wrapped ``process_preloads`` after the instrumentor: uninstrument
    leaves their wrapper (around the package's), which then adds nothing."""
    original = distributed.preloading.process_preloads
    instrumentor.instrument()
    ours = distributed.preloading.process_preloads
    distributed.preloading.process_preloads = lambda *a, **k: ours(*a, **k)
    try:
        instrumentor.uninstrument()
        server = Worker.__new__(Worker)  # (a stand-in: nothing started)
        loaded = distributed.preloading.process_preloads(
            server, ["dask_otel_spans.names"], [])
        assert [p.name for p in loaded] == ["dask_otel_spans.names"]
    finally:
        distributed.preloading.process_preloads = original


def test_instrument_twice_changes_nothing_more(instrumentor, caplog):
    with dask.config.set({"distributed.worker.preload": []}):
        instrumentor.instrument()
        process_preloads = distributed.preloading.process_preloads
        with caplog.at_level(logging.WARNING):
            DaskInstrumentor().instrument()  # (one instance: BaseInstrumentor's rule)
        assert "already instrumented" in caplog.text
        assert dask.config.get("distributed.worker.preload") == [PRELOAD]
        assert distributed.preloading.process_preloads is process_preloads
        instrumentor.uninstrument()
        assert dask.config.get("distributed.worker.preload") == []


@pytest.mark.parametrize("preload, argv, expected", [
    ([], [], ([PRELOAD], [])),
    ("theirs", [], (["theirs", PRELOAD], [])),
    (("a", "b"), [["--x"], []], (["a", "b", PRELOAD], [["--x"], [], []])),
    (["a"], ["--shared"], (["a", PRELOAD], ["--shared"])),
])
def test_with_preload_appends_the_package_and_keeps_argv_aligned(
        preload, argv, expected):
    assert with_preload(preload, argv) == expected


def test_with_preload_leaves_a_list_that_has_it():
    preload, argv = ["a", PRELOAD], [["x"], []]
    assert with_preload(preload, argv) == (preload, argv)
    assert with_preload(preload, argv)[0] is preload


def test_an_explicit_preload_list_of_a_server_gets_the_package(instrumentor):
    """``dask scheduler --preload other`` replaces the config lists: the instrumented
    ``process_preloads`` adds the package to a scheduler's or worker's list (a
    client's stays as it is); and to the list a nanny hands its worker."""
    instrumentor.instrument()
    other = "dask_otel_spans.names"  # (a module without dask_setup)
    for kind in (Scheduler, Worker):
        server = kind.__new__(kind)  # (a stand-in: nothing started)
        loaded = distributed.preloading.process_preloads(server, [other], [])
        assert [p.name for p in loaded] == [other, PRELOAD]
    nanny = Nanny.__new__(Nanny)
    nanny.preload, nanny.preload_argv = (other,), [["--x"]]
    distributed.preloading.process_preloads(nanny, [], [])
    assert (nanny.preload, nanny.preload_argv) == ([other, PRELOAD], [["--x"], []])
    instrumentor.uninstrument()
    server = Scheduler.__new__(Scheduler)
    assert [p.name for p in distributed.preloading.process_preloads(
        server, [other], [])] == [other]


@pytest.mark.parametrize("kind, name", [(Scheduler, names.PLUGIN_NAME),
                                        (Worker, names.WORKER_PLUGIN_NAME)])
def test_dask_setup_keeps_the_plugin_a_server_has(kind, name):
    """Preloaded twice (``--preload dask_otel_spans`` and the instrumentor's): the
    second ``dask_setup`` adds nothing."""
    server = kind.__new__(kind)  # (a stand-in: nothing started)
    server.plugins = {name: object()}

    def refuse(*args, **kwargs):
        raise AssertionError("a second plugin")

    server.add_plugin = server.plugin_add = refuse
    assert dask_otel_spans.dask_setup(server) is None


@pytest.mark.parametrize("preload", [None, [PRELOAD], ["dask_otel_spans.names"],
                                     [PRELOAD, PRELOAD]])
@gen_test()
async def test_an_instrumented_scheduler_gets_one_plugin(preload, instrumentor,
                                                         tmp_path):
    """``Scheduler()`` in an instrumented process: the plugin, once, with no preload,
    with ``preload=["dask_otel_spans"]`` as well, with another explicit preload, and
    preloaded twice (``dask_setup`` keeps the first)."""
    from dask_otel_spans import OTelSpansPlugin

    instrumentor.instrument()
    with dask.config.set({"otel-spans.output-dir": str(tmp_path),
                          "otel-spans.export-process": False}):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            async with Scheduler(dashboard_address=":0", preload=preload) as s:
                plugins = [p for p in s.plugins.values()
                           if isinstance(p, OTelSpansPlugin)]
                assert len(plugins) == 1
                assert s.plugins.get(names.PLUGIN_NAME) is plugins[0]
    assert not [w for w in caught if "already contains a plugin" in str(w.message)]
