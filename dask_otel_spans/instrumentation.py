"""Zero-code: ``DaskInstrumentor``, the OpenTelemetry way in.

``opentelemetry-instrument dask scheduler``, ``opentelemetry-instrument dask worker ADDR``
and ``opentelemetry-instrument python app.py`` (and the Kubernetes OTel Operator's
injection, which runs the same auto-instrumentation) find it through the
``opentelemetry_instrumentor`` entry point ``dask``;
``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=dask`` skips it. From code::

    from dask_otel_spans.instrumentation import DaskInstrumentor

    DaskInstrumentor().instrument()     # ... .uninstrument() undoes it

While it is on, in this process:

- every scheduler and worker started afterwards (``dask scheduler``/``dask worker``, a
  worker spawned by a nanny, ``LocalCluster``, ``Scheduler()`` in code) preloads
  ``dask_otel_spans``, and so gets the package's plugin: ``dask_otel_spans`` is added to
  the dask config lists ``distributed.scheduler.preload`` and
  ``distributed.worker.preload`` (after the user's entries; a nanny hands its config to
  the worker process it spawns), and to an explicit preload list that replaces them
  (``--preload other``). A ``--preload dask_otel_spans`` as well still gives one plugin
  (``dask_setup`` keeps the one a server has).
- ``distributed.span`` and ``distributed.spans.span`` are the package's
  :func:`~dask_otel_spans.span`, so plain dask code carries its OTel context.
- every submission of a ``Client`` (``compute``, ``persist``, ``submit``, ``map``,
  ``get``, ``dask.compute`` on the distributed scheduler) made with no dask span block
  open carries the caller's context (:func:`~dask_otel_spans.client.caller_carrier`):
  its task code runs in the caller's trace, and the OTel span of the dask span its
  tasks land in links to the caller's span.

``uninstrument()`` restores what was changed, and only that: a setting or attribute
changed by someone else in between stays theirs.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
    BaseInstrumentor,  # (mypy 2.4 finds no class in opentelemetry-instrumentation 0.66b1)
)

if TYPE_CHECKING:
    from distributed import Client, Nanny
    from distributed.core import Server
    from distributed.preloading import PreloadManager

logger = logging.getLogger(__name__)

#: A preload setting: one entry, a list of them, or none (dask's config, or what a
#: server was given)
_Preload: TypeAlias = "str | Sequence[str] | None"
#: Its arguments: one list shared by every preload, or one list per preload
_PreloadArgv: TypeAlias = "Sequence[str] | Sequence[Sequence[str]] | None"
_R = TypeVar("_R")

#: The distributed versions the instrumentor supports: the package's ``instruments``
#: extra says the same (the launcher checks the extra, ``instrument()`` this)
_instruments = ("distributed >= 2024.1.0",)

#: The preload the instrumentor adds: this package (its ``dask_setup``)
PRELOAD = "dask_otel_spans"
#: The dask config lists it is added to
PRELOAD_KEYS = ("distributed.scheduler.preload", "distributed.worker.preload")
_NANNY_KEYS = ("distributed.worker.preload", "distributed.worker.preload-argv")

#: Whether the wrapped ``process_preloads`` adds the preload: a wrapper that outlives
#: ``uninstrument()`` (someone wrapped it in turn) passes lists through unchanged
_adding = False


def _entries(preload: _Preload) -> list[str]:
    """A preload setting as a list of entries (dask takes a string for one)."""
    if not preload:
        return []
    if isinstance(preload, str):
        return [preload]
    return list(preload)


def with_preload(preload: _Preload, preload_argv: _PreloadArgv
                 ) -> tuple[_Preload, _PreloadArgv]:
    """``preload`` and ``preload_argv`` with this package's preload after the given
    ones, unless it is among them (then both unchanged). An ``argv`` given per preload
    (a list of lists) gets an empty one for it; one shared by all (a list of strings)
    stays, as this package's ``dask_setup`` takes no arguments."""
    entries = _entries(preload)
    if PRELOAD in entries:
        return preload, preload_argv
    argv = list(preload_argv or ())
    if argv and not isinstance(argv[0], str):
        return [*entries, PRELOAD], [*argv, []]
    return [*entries, PRELOAD], preload_argv


@dataclass
class _AttributePatch:
    """An attribute of a module or class replaced; undone only while it is still
    the replacement."""

    owner: object
    name: str
    original: object
    replacement: object

    def apply(self) -> None:
        setattr(self.owner, self.name, self.replacement)

    def undo(self) -> None:
        if getattr(self.owner, self.name, None) is self.replacement:
            setattr(self.owner, self.name, self.original)


@dataclass
class _ConfigPatch:
    """This package's preload appended to one dask config list. Undone: the value
    from before when the list is still the one set, else only the entry taken out of
    the list as it is now."""

    key: str
    before: object
    after: _Preload

    def undo(self) -> None:
        import dask.config

        now = dask.config.get(self.key, default=None)
        if now == self.after:
            dask.config.set({self.key: self.before})
        elif PRELOAD in _entries(now):
            dask.config.set({self.key: [e for e in _entries(now) if e != PRELOAD]})


def _preload_config() -> list[_ConfigPatch]:
    """Append this package's preload to the dask config lists that lack it."""
    import dask.config

    patches = []
    for key in PRELOAD_KEYS:
        before = dask.config.get(key, default=None)
        after, _ = with_preload(before, ())
        if after is before:
            continue  # there already
        dask.config.set({key: after})
        patches.append(_ConfigPatch(key, before, after))
    return patches


def _preloading_servers(original: Callable[..., PreloadManager]
                        ) -> Callable[..., PreloadManager]:
    """``distributed.preloading.process_preloads`` that gives schedulers and workers
    this package's preload when the list they were given lacks it (an explicit
    ``--preload other`` replaces the config lists), and a nanny's worker the same."""
    from distributed import Nanny, Scheduler, Worker

    @functools.wraps(original)
    def process_preloads(dask_server: Server | Client, preload: _Preload,
                         preload_argv: _PreloadArgv, *args: object,
                         **kwargs: object) -> PreloadManager:
        if _adding:
            try:
                if isinstance(dask_server, (Scheduler, Worker)):
                    preload, preload_argv = with_preload(preload, preload_argv)
                elif isinstance(dask_server, Nanny):
                    _preload_nanny_worker(dask_server)
            except Exception as e:  # never what keeps a server from starting
                logger.error("dask_otel_spans: could not add the preload to %s "
                             "(%s: %s)", type(dask_server).__name__,
                             type(e).__name__, e)
        return original(dask_server, preload, preload_argv, *args, **kwargs)

    process_preloads.__dask_otel_spans__ = True  # type: ignore[attr-defined]
    return process_preloads


def _carrying_callers(original: Callable[..., _R]) -> Callable[..., _R]:
    """``Client._graph_to_futures`` (every submission goes through it) that annotates
    a bare submission with the caller's context (and, once per client, checks that
    the scheduler runs the plugin)."""
    import dask

    from dask_otel_spans import names
    from dask_otel_spans.client import caller_carrier, check_plugin_soon

    @functools.wraps(original)
    def _graph_to_futures(self: Client, *args: object, **kwargs: object) -> _R:
        check_plugin_soon(self)
        try:
            carrier = caller_carrier()
        except Exception as e:  # never what keeps work from being submitted
            carrier = None
            logger.error("dask_otel_spans: cannot read the caller's context for a "
                         "submission (%s: %s); it is submitted without it",
                         type(e).__name__, e)
        if carrier is None:
            return original(self, *args, **kwargs)
        with dask.annotate(**{names.CALLER_ANNOTATION_KEY: carrier}):
            return original(self, *args, **kwargs)

    return _graph_to_futures


def _preload_nanny_worker(nanny: Nanny) -> None:
    """Give the worker a nanny spawns this package's preload: the nanny passes its
    worker preloads (explicit, else the config's) to the worker process, which may
    not be instrumented itself."""
    import dask.config

    if not hasattr(nanny, "preload") or not hasattr(nanny, "preload_argv"):
        return
    preload = nanny.preload or dask.config.get(_NANNY_KEYS[0], default=None)
    argv = nanny.preload_argv or dask.config.get(_NANNY_KEYS[1], default=None)
    new_preload, new_argv = with_preload(preload, argv)
    if new_preload is not preload:
        nanny.preload, nanny.preload_argv = new_preload, new_argv


class DaskInstrumentor(BaseInstrumentor):
    """Turns the package on for every scheduler and worker this process starts, and
    makes ``distributed.span`` the package's ``span()`` (see the module's text)."""

    _config_patches: Sequence[_ConfigPatch] = ()
    _attribute_patches: Sequence[_AttributePatch] = ()

    def instrumentation_dependencies(self) -> Collection[str]:
        return _instruments

    def _instrument(self, **kwargs: object) -> None:
        global _adding
        import distributed
        import distributed.preloading
        import distributed.spans

        from dask_otel_spans.client import span

        original_preloads = distributed.preloading.process_preloads
        original_submit = distributed.Client._graph_to_futures
        patches = [
            _AttributePatch(distributed, "span", distributed.span, span),
            _AttributePatch(distributed.spans, "span", distributed.spans.span, span),
            _AttributePatch(distributed.Client, "_graph_to_futures", original_submit,
                            _carrying_callers(original_submit)),
        ]
        if not getattr(original_preloads, "__dask_otel_spans__", False):
            patches.append(_AttributePatch(
                distributed.preloading, "process_preloads", original_preloads,
                _preloading_servers(original_preloads),
            ))
        for patch in patches:
            patch.apply()
        self._attribute_patches = patches
        self._config_patches = _preload_config()
        _adding = True
        logger.debug("dask_otel_spans: instrumented (schedulers and workers preload "
                     "dask_otel_spans; distributed.span is dask_otel_spans.span)")

    def _uninstrument(self, **kwargs: object) -> None:
        global _adding
        _adding = False
        for config_patch in reversed(self._config_patches):
            config_patch.undo()
        for attribute_patch in reversed(self._attribute_patches):
            attribute_patch.undo()
        self._config_patches = ()
        self._attribute_patches = ()
