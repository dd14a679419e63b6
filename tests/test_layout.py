"""The package's sides, as its folders show them, import in one direction: protocol/
imports no side, the scheduler side nothing of the export side, the worker side
nothing of the scheduler, transport or export sides, the report (reports/) only the
files' readers (sdk/). A new crossing fails here."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "dask_otel_spans"
SIDES = ("protocol", "client", "scheduler", "transport", "export", "sdk", "worker",
         "reports")
#: side -> the sides it must not import
FORBIDDEN = {
    "protocol": {"client", "scheduler", "transport", "export", "sdk", "worker",
                 "reports"},
    "client": {"scheduler", "transport", "export", "sdk", "worker", "reports"},
    "scheduler": {"export", "sdk", "worker", "reports"},
    "transport": {"client", "scheduler", "worker", "reports"},
    "export": {"client", "scheduler", "transport", "worker", "reports"},
    "sdk": {"client", "scheduler", "transport", "export", "worker", "reports"},
    "worker": {"client", "scheduler", "transport", "export", "reports"},
    "reports": {"scheduler", "transport", "export", "worker"},
}


def side_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "dask_otel_spans" \
        and parts[1] in SIDES else None


def imports_of(path: Path) -> set[str]:
    """Every ``dask_otel_spans`` module ``path`` imports, at any depth (inside
    functions and ``TYPE_CHECKING`` blocks too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("dask_otel_spans")}


MODULES = sorted(p for side in SIDES for p in (PACKAGE / side).rglob("*.py"))


def test_every_side_is_a_folder_with_modules():
    assert {p.relative_to(PACKAGE).parts[0] for p in MODULES} == set(SIDES)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_side_imports_only_in_the_allowed_direction(path):
    side = path.relative_to(PACKAGE).parts[0]
    crossings = {m for m in imports_of(path) if side_of(m) in FORBIDDEN[side]}
    assert not crossings, f"{side}/ must not import {sorted(crossings)}"


#: top-level module -> the sides it may import: the foundation (names, settings,
#: ``OTEL_*`` read without the SDK, once-only logging, background threads) none; the
#: package's entry points what they start (the plugins load lazily); the former
#: paths what they point to
TOP_LEVEL = {
    "names": set(), "logonce": set(), "background": set(), "config": {"protocol"},
    "otelenv": set(), "otlpendpoint": set(), "wording": set(),
    "__init__": {"client", "scheduler", "worker"},
    "instrumentation": {"client"},
    "cli": {"client", "protocol", "reports", "sdk"},
    "demo": {"client", "protocol", "reports", "sdk"},
    "state": {"client"}, "plugin": {"scheduler"}, "export_child": set(),
}


def test_every_top_level_module_has_a_rule():
    assert {p.stem for p in PACKAGE.glob("*.py")} == set(TOP_LEVEL)


@pytest.mark.parametrize("name", sorted(TOP_LEVEL))
def test_a_top_level_module_imports_only_the_sides_it_may(name):
    sides = {side_of(m) for m in imports_of(PACKAGE / f"{name}.py")} - {None}
    assert sides <= TOP_LEVEL[name], f"{name}.py must not import {sides - TOP_LEVEL[name]}"


def test_the_check_sees_a_crossing(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from dask_otel_spans.export.session import X\n")
    assert side_of(next(iter(imports_of(module)))) == "export"


@pytest.mark.cluster  # (a fresh interpreter)
def test_the_client_imports_no_side_and_no_sdk():
    """``import dask_otel_spans`` (``span``, ``wait_for_export``) loads neither a side
    of the package nor the OTel SDK; the plugins load when first asked for."""
    import subprocess
    import sys

    code = (
        "import sys, dask_otel_spans\n"
        "print(sorted(m for m in sys.modules if m.startswith("
        "('dask_otel_spans.scheduler', 'dask_otel_spans.export', 'opentelemetry.sdk',"
        " 'dask_otel_spans.transport', 'dask_otel_spans.worker', 'dask_otel_spans.sdk'))))\n"
        "dask_otel_spans.OTelSpansPlugin, dask_otel_spans.OTelWorkerPlugin\n"
        "print('dask_otel_spans.scheduler.plugin' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout.split("\n")
    assert out[:2] == ["[]", "True"]


#: What a scheduler process whose export runs in the export process does not import
EXPORT_SIDE = ("opentelemetry.sdk", "google.protobuf", "opentelemetry.exporter",
               "dask_otel_spans.export", "dask_otel_spans.sdk")


@pytest.mark.cluster  # (a fresh interpreter)
def test_the_scheduler_plugin_imports_no_export_side_and_no_sdk():
    """``import dask_otel_spans.scheduler.plugin`` loads neither the export side nor
    the OTel SDK or protobuf: only the thread transport, chosen at start, does."""
    import subprocess
    import sys

    code = (
        "import sys, dask_otel_spans.scheduler.plugin\n"
        f"print(sorted(m for m in sys.modules if m.startswith({EXPORT_SIDE!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    assert out.strip() == "[]"


def test_every_test_module_has_a_name_of_its_own():
    # (pytest imports test modules by their basename, tests/ having no packages: two
    # files of one name in two folders stop the second from being collected)
    tests = Path(__file__).parent
    names = [p.name for p in tests.rglob("test_*.py")]
    assert sorted({n for n in names if names.count(n) > 1}) == []
