"""One Jaeger build for every test that needs it: ``deploy/jaeger/build.sh`` run by the
conftest as the tests are collected and by each Jaeger test at once (the xdist workers),
with a stand-in Go that takes a while, counts its runs and writes a binary, in a cache
of its own."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.jaeger_build import jaeger_binary, jaeger_built, jaeger_path, start_jaeger_build
from support.polling import wait_for

WAITERS = 4


@pytest.fixture
def stand_in_go(tmp_path: Path) -> dict[str, str]:
    """build.sh's environment: an empty cache, and a Go that takes 2 s, writes a line
    per run to ``go-runs`` and an executable where ``-o`` says."""
    go = tmp_path / "go"
    go.write_text(f"""#!/bin/sh
echo "$$" >> "{tmp_path / 'go-runs'}"
sleep 2
while [ "$#" -gt 0 ]; do
    if [ "$1" = "-o" ]; then out="$2"; fi
    shift
done
printf '#!/bin/sh\\necho stand-in\\n' > "$out" && chmod +x "$out"
""")
    go.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "DASK_OTEL_SPANS_JAEGER"}
    return {**env, "GO": str(go), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def go_runs(tmp_path: Path) -> list[str]:
    runs = tmp_path / "go-runs"
    return runs.read_text().split() if runs.exists() else []


@pytest.mark.cluster  # (starts build.sh processes)
def test_every_jaeger_test_waits_for_the_one_build_started_at_collection(
        stand_in_go, tmp_path):
    assert not jaeger_built(stand_in_go)
    build = start_jaeger_build(stand_in_go)
    wait_for(lambda: go_runs(tmp_path), timeout=30)  # (it builds: the others wait)
    with ThreadPoolExecutor(WAITERS) as pool:
        paths = list(pool.map(lambda _: jaeger_binary(wait=60, env=stand_in_go),
                              range(WAITERS)))
    assert build.wait(30) == 0
    assert paths == [jaeger_path(stand_in_go)] * WAITERS
    assert len(go_runs(tmp_path)) == 1
    assert jaeger_built(stand_in_go)
    log = Path(jaeger_path(stand_in_go)).parent / "build.log"
    assert "building jaeger" in log.read_text()


@pytest.mark.cluster  # (starts build.sh processes)
def test_tests_that_start_together_on_a_fresh_machine_build_once(stand_in_go, tmp_path):
    with ThreadPoolExecutor(WAITERS) as pool:
        paths = list(pool.map(lambda _: jaeger_binary(wait=60, env=stand_in_go),
                              range(WAITERS)))
    assert set(paths) == {jaeger_path(stand_in_go)}
    assert len(go_runs(tmp_path)) == 1
