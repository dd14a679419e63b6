"""What the README, the data contract and the shipped settings file say about the
code's own places (modules run, constants, files cited) is where the code has it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from dask_otel_spans.transport.supervisor import CHILD_MODULE

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "dask_otel_spans"
DOCS = [ROOT / "README.md", ROOT / "docs" / "data-contract.md",
        ROOT / "docs" / "how-it-works.md", PACKAGE / "otel-spans.yaml"]


def test_the_docs_name_the_module_the_export_process_runs():
    named = {m for doc in DOCS
             for m in re.findall(r"python -m (dask_otel_spans[\w.]*)", doc.read_text())}
    assert named == {CHILD_MODULE}


@pytest.mark.parametrize("doc", DOCS[:3], ids=lambda p: p.name)
def test_every_name_the_docs_place_in_a_module_is_there(doc):
    placed = re.findall(r"`(\w+)` in `(dask_otel_spans/[\w/]+\.py)`", doc.read_text())
    for name, module in placed:
        source = (ROOT / module).read_text() if (ROOT / module).exists() else ""
        assert re.search(rf"^(?:{name}\b.*=|def {name}\b|class {name}\b)", source,
                         re.MULTILINE), f"{doc.name}: no {name} in {module}"


def test_every_document_the_package_cites_is_in_the_repository():
    cited = {(path.name, doc) for path in PACKAGE.rglob("*.py")
             for doc in re.findall(r"[\w./-]+\.md\b", path.read_text())}
    missing = {(module, doc) for module, doc in cited if not (ROOT / doc).exists()}
    assert not missing
