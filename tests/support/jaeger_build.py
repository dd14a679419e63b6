"""The Jaeger binary the Jaeger tests run, built once per machine by
``deploy/jaeger/build.sh`` (minutes the first time): a run that collects a test marked
``jaeger`` starts that build as it collects (:func:`start_jaeger_build`, from
``tests/conftest.py``), and every such test waits for that one build
(:func:`jaeger_binary`; build.sh's lock makes any other run of it wait for the one
building)."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from support.paths import DEPLOY

BUILD = DEPLOY / "jaeger" / "build.sh"
#: the environment build.sh runs in, as it was when the tests were collected: a fixture
#: that moves ``XDG_CACHE_HOME`` (or ``HOME``) for a test must not send it to build
#: Jaeger again in an empty cache (minutes, and Go's build cache moves with it)
_BUILD_ENV = dict(os.environ)
#: Seconds a Jaeger test waits for the build (a first build: about 8 minutes on 2
#: idle cores, 12 on a busy machine; README, "Development"); its pytest timeout grows
#: by as much while the binary is not built
BUILD_WAIT = 1800.0


def jaeger_path(env: Mapping[str, str] | None = None) -> str:
    """Where the binary is, or will be once built (``build.sh --where``)."""
    where = subprocess.run(["bash", str(BUILD), "--where"], capture_output=True, text=True,
                           env=dict(env if env is not None else _BUILD_ENV), check=True)
    return where.stdout.strip()


def jaeger_built(env: Mapping[str, str] | None = None) -> bool:
    """Whether the binary is built (nothing to wait for)."""
    return os.access(jaeger_path(env), os.X_OK)


def start_jaeger_build(env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``build.sh`` in the background, its output in ``build.log`` beside the
    binary; it goes on after the tests (for the next run) when they end first. A
    build running already (another test process's) is waited for, not repeated."""
    path = Path(jaeger_path(env))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        log = open(path.parent / "build.log", "ab")
    except OSError:
        log = open(os.devnull, "ab")
    with log:
        return subprocess.Popen(["bash", str(BUILD)], stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env=dict(env if env is not None else _BUILD_ENV))


def jaeger_binary(wait: float = BUILD_WAIT, env: Mapping[str, str] | None = None) -> str:
    """The Jaeger binary: ``deploy/jaeger/build.sh`` prints its path, once the one
    build (this run's, started as it collected, or any other) is done, or building it
    here. Fails, never skips, when there is none.

    Parameters
    ----------
    wait
        Seconds to wait for the build; past them it goes on in the background for
        the next run, and this fails.
    env
        The environment build.sh runs in (default: the one of the collection).

    Returns
    -------
    str
        The path of the executable.
    """
    build = subprocess.Popen(["bash", str(BUILD)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True,
                             env=dict(env if env is not None else _BUILD_ENV))
    try:
        out, err = build.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"no Jaeger binary yet: {BUILD} (pid {build.pid}) waits for or runs the "
            f"build, which took longer than a test waits ({wait:.0f} s); it goes on in "
            "the background: run the tests again when it is done") from None
    path = out.strip().splitlines()[-1] if out.strip() else ""
    assert build.returncode == 0 and os.access(path, os.X_OK), (
        f"no Jaeger binary: {BUILD} failed (rc {build.returncode}); it needs Go and "
        f"the Go module proxy.\n{err[-3000:]}")
    return path
