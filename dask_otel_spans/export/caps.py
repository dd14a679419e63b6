"""The metrics' cardinality caps: the ``dask.span.name`` values (a depth, a length, a
number of names) and the series per instrument (kept under the SDK's cardinality
limit). Pure bookkeeping, thread-safe, bounded memory."""
from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dask_otel_spans import names
from dask_otel_spans.sdk.providers import SDK_DEFAULT_CARDINALITY_LIMIT

if TYPE_CHECKING:
    from dask_otel_spans.export.metrics import Instrument

logger = logging.getLogger(__name__)

#: Attributes that make series many, folded to ``__other__`` first past the series cap
_HIGH_CARDINALITY = (names.SPAN_NAME, names.TASK_PREFIX)

#: Longest ``dask.span.name`` metric value, in characters (span attributes follow
#: ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT`` instead)
MAX_SPAN_NAME_LENGTH = 256
#: Tag tuples whose span name is remembered (:class:`SpanNameCap`)
REMEMBERED_TAGS = 4096


class SpanNameCap:
    """The ``dask.span.name`` metric attribute: tags joined with ``/``, cut to a depth
    and to ``max_length`` characters, and at most ``max_names`` distinct values (then
    ``__other__``).

    Thread-safe; memory is bounded by ``max_names`` × ``max_length``.
    """

    def __init__(self, depth: int | None, max_names: int,
                 max_length: int = MAX_SPAN_NAME_LENGTH):
        self.depth = depth
        self.max_names = max(0, max_names)
        self.max_length = max(1, max_length)
        self._seen: set[str] = set()
        #: the name of tag tuples seen lately (admitted names only)
        self._names: dict[tuple[str, ...], str] = {}
        self._lock = threading.Lock()
        self.overflowed = False

    def __call__(self, tags: Sequence[str]) -> str:
        try:
            known = self._names.get(tags) if type(tags) is tuple else None
        except TypeError:  # (a tag that cannot be hashed: named the long way)
            known = None
        if known is not None:
            return known
        shown = tags[: self.depth] if self.depth is not None and self.depth > 0 else tags
        value = names.SPAN_NAME_SEPARATOR.join(str(t) for t in shown)
        if len(value) > self.max_length:
            value = value[: self.max_length]
        with self._lock:
            if value in self._seen:
                return self._remember(tags, value)
            if len(self._seen) < self.max_names:
                self._seen.add(value)
                return self._remember(tags, value)
        if not self.overflowed:
            self.overflowed = True
            logger.warning(
                "dask_otel_spans: more than %d distinct span names; further ones are "
                "reported as %r in metrics (otel-spans.metrics.max-span-names)",
                self.max_names,
                names.OTHER_SPAN_NAME,
            )
        # (past the cap for good: the names admitted are never forgotten)
        return self._remember(tags, names.OTHER_SPAN_NAME)

    def _remember(self, tags: Sequence[str], value: str) -> str:
        """``value``, remembered as the name of ``tags`` (a tuple: the tags of a
        span, which its later metric updates name again); at most
        :data:`REMEMBERED_TAGS` tag tuples, then they are forgotten at once (dict
        operations: safe without the lock)."""
        if type(tags) is tuple:
            if len(self._names) >= REMEMBERED_TAGS:
                self._names.clear()
            try:
                self._names[tags] = value
            except TypeError:
                pass
        return value


class SeriesCap:
    """At most ``max_series`` attribute sets per instrument, overflow included.

    Kept at or below the SDK's cardinality limit (2000 by default), it keeps the
    plugin's series out of the SDK's anonymous ``otel.metric.overflow`` point: past
    ``max_series`` less a reserve, a new attribute set keeps its context, activity and
    unit, but its span name and task prefix become ``__other__``; when only one set is
    left, everything else lands in one set whose every attribute is ``__other__``.
    Totals stay right; only the breakdown of the newest series is lost. The first
    fold is logged once per instrument.

    Thread-safe; memory is bounded by ``max_series`` sets per instrument. The cap
    counts every set ever admitted, as cumulative temporality (the SDK's default, and
    Prometheus') keeps every series for the life of the process.
    """

    def __init__(self, max_series: int | None = SDK_DEFAULT_CARDINALITY_LIMIT):
        #: None: no cap (e.g. delta temporality, where the SDK's limit is per
        #: collection cycle and forgets idle series)
        self.max_series = None if max_series is None else max(1, max_series)
        #: sets kept apart for the ``__other__`` forms of span name and task prefix
        self.reserve = 0 if self.max_series is None else min(100, self.max_series // 10)
        self._admitted: dict[Instrument, set[frozenset[tuple[str, str]]]] = {}
        self._lock = threading.Lock()
        #: instruments whose first fold was logged
        self.folded_instruments: set[str] = set()

    def __call__(self, instrument: Instrument, attributes: dict[str, str]) -> dict[str, str]:
        """The attributes under which a new series of ``instrument`` is recorded."""
        if self.max_series is None:
            return attributes
        key = frozenset(attributes.items())
        with self._lock:
            admitted = self._admitted.setdefault(instrument, set())
            if key in admitted:
                return attributes
            if len(admitted) < self.max_series - self.reserve - 1:
                admitted.add(key)
                return attributes
            folded = {
                k: names.OTHER_SPAN_NAME if k in _HIGH_CARDINALITY else v
                for k, v in attributes.items()
            }
            folded_key = frozenset(folded.items())
            if folded_key not in admitted and len(admitted) >= self.max_series - 1:
                folded = dict.fromkeys(attributes, names.OTHER_SPAN_NAME)
                folded_key = frozenset(folded.items())
            admitted.add(folded_key)
        self._log_fold(instrument)
        return folded

    def _log_fold(self, instrument: Instrument) -> None:
        name = str(getattr(instrument, "name", instrument))
        if name in self.folded_instruments:
            return
        self.folded_instruments.add(name)
        logger.warning(
            "dask_otel_spans: %s reached %d metric series (otel-spans.metrics."
            "max-series); newer series are reported with %s %r",
            name,
            (self.max_series or 0) - self.reserve - 1,
            " and ".join(_HIGH_CARDINALITY),
            names.OTHER_SPAN_NAME,
        )


