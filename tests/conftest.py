"""Shared fixtures (in-memory OTel providers, a real OTLP/gRPC receiver), and the
``cluster`` marker: what a test needs beyond this process.

The suite in two layers. A test is marked ``cluster`` (``pytest -m "not cluster"``
runs the rest, the pure layer, in seconds) when it

- runs on distributed's ``gen_cluster`` or ``gen_test`` (an ``async def`` test: an
  in-process scheduler and workers), found here by its wrapper;
- is under ``processes/``: real ``dask scheduler`` and ``dask worker`` processes,
  Prometheus, found here by its folder;
- or starts a process or a cluster of its own (an export process, a CLI run, a
  ``LocalCluster``): marked where it is written, ``@pytest.mark.cluster``.

An unmarked test that starts a process or a dask server fails, naming the marker.
Helpers are in ``support/``.
"""
from __future__ import annotations

import inspect
import multiprocessing.process
import subprocess
from pathlib import Path

import distributed.core
import pytest
from support.jaeger_build import BUILD_WAIT, jaeger_built, jaeger_path, start_jaeger_build
from support.providers import MemoryProviders
from support.receivers import OTLPReceiver

PROCESSES = Path(__file__).parent / "processes"


def starts_a_cluster(item: pytest.Item) -> bool:
    """Whether ``item`` is marked ``cluster`` by its wrapper or its folder."""
    function = getattr(item, "function", None)
    if function is not None and inspect.iscoroutinefunction(inspect.unwrap(function)):
        return True  # (gen_cluster or gen_test runs the coroutine)
    return PROCESSES in item.path.parents


@pytest.hookimpl(tryfirst=True)  # (before -m deselects by marker)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if starts_a_cluster(item):
            item.add_marker(pytest.mark.cluster)
    # the files that start clusters and processes first, the pure ones after: with
    # ``-n 3 --dist loadfile`` a long file handed out last keeps one worker busy while
    # the others idle; the pure files, short, even them out at the end. The Jaeger
    # files last of the slow ones: on a fresh machine they wait for its build
    slow = {item.path for item in items if item.get_closest_marker("cluster")}
    jaeger = {item.path for item in items if item.get_closest_marker("jaeger")}
    # (stable: order kept within)
    items.sort(key=lambda item: (item.path not in slow, item.path in jaeger))


def pytest_report_header(config: pytest.Config) -> str | None:
    """Said at the top of a run on a machine without the Jaeger binary: the tests
    marked ``jaeger`` build it first, and the run seems to stall while they wait."""
    if config.option.collectonly or jaeger_built():
        return None
    return (f"jaeger: not built yet; the tests marked jaeger build it once from the Go "
            f"module proxy and wait for it (8-13 min on 2 cores; its log: "
            f"{Path(jaeger_path()).parent / 'build.log'})")


def pytest_collection_finish(session: pytest.Session) -> None:
    """When tests marked ``jaeger`` are to run and the binary is not built (a fresh
    machine): start its build now, once (``deploy/jaeger/build.sh``'s lock: each
    xdist worker asks, one builds), and let each of them wait for it past pytest's
    per-test timeout."""
    needing = [item for item in session.items if item.get_closest_marker("jaeger")]
    if not needing or session.config.option.collectonly or jaeger_built():
        return
    start_jaeger_build()
    timeout = float(session.config.getini("timeout") or 0)
    if timeout:
        for item in needing:
            item.add_marker(pytest.mark.timeout(timeout + BUILD_WAIT))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test not marked ``cluster`` that starts a process or a dask server (a
    scheduler, a worker, a nanny), in its body or its fixtures, fails: the pure layer
    stays pure."""
    if item.get_closest_marker("cluster") is not None:
        yield
        return

    def refuse(*args, **kwargs):
        raise AssertionError(
            f"{item.nodeid} starts a process or a dask server: mark it "
            "@pytest.mark.cluster (see tests/conftest.py)"
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", refuse)
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        patch.setattr(distributed.core.Server, "__init__", refuse)
        yield


@pytest.fixture
def memory() -> MemoryProviders:
    providers = MemoryProviders()
    yield providers
    providers.shutdown()


@pytest.fixture
def otlp_receiver() -> OTLPReceiver:
    receiver = OTLPReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(scope="module")
def module_otlp_receiver() -> OTLPReceiver:
    """One receiver for a module's shared cluster (its tests look at their own spans)."""
    receiver = OTLPReceiver().start()
    yield receiver
    receiver.stop()


@pytest.fixture(autouse=True, scope="module")
def own_module_spool(tmp_path_factory):
    """:func:`own_spool` for module fixtures (they start before a test's own)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(autouse=True)
def own_spool(tmp_path_factory, monkeypatch):
    """A spool directory of each test's own: the default one (``auto``, below the
    user's cache directory) moves with ``XDG_CACHE_HOME``, in this process and in
    the processes it starts; what one test could not deliver is never sent to
    another test's receiver, nor left in the user's cache."""
    from dask_otel_spans.sdk.spool import user_spool_directory

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
    return user_spool_directory()
