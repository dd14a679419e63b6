"""The TaskGroup collision warning: dask attributes a task group to one span, so the
tasks of a later ``span()`` block that fall in a group of an earlier span are
counted there, and the later span looks empty. Said once per pair of spans, at most
:data:`MAX_WARNINGS` times per :data:`WINDOW`, in the export session.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from dask_otel_spans import names
from dask_otel_spans.export.bounded import BoundedMemory

logger = logging.getLogger(__name__)

#: Warnings said per window at most (the others are counted, and said with the next)
MAX_WARNINGS = 10
WINDOW = 60.0
#: Pairs, and block names, remembered at most
REMEMBERED = 1000


def _joined(tags: Sequence[str]) -> str:
    return names.SPAN_NAME_SEPARATOR.join(map(str, tags))


class CollisionWarnings:
    """Say which blocks' tasks dask put in another span.

    The forwarder sees the collision (the block's ``otel`` annotation names the span
    it asked for; dask's ``span`` annotation, the span it chose); the asked span was
    never made by dask, so its tags come with the client helper's close notice,
    which may come after the graph: a collision waits for it (a bounded number).

    Parameters
    ----------
    clock:
        Monotonic seconds, for the rate limit
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._said: BoundedMemory[tuple[str, str], None] = BoundedMemory(REMEMBERED)
        #: asked span id -> (chosen span's tags, chosen span id, group), until its
        #: tags are known
        self._waiting: BoundedMemory[str, tuple[tuple[str, ...], str, str]] = (
            BoundedMemory(REMEMBERED))
        #: span id -> tags, of the blocks whose close notice came
        self._tags: BoundedMemory[str, tuple[str, ...]] = BoundedMemory(REMEMBERED)
        self._window_start = -WINDOW
        self._in_window = 0
        self.suppressed = 0
        #: warnings said
        self.said = 0

    def seen(self, collisions: Iterable[Sequence[str]],
             tags_of: Mapping[str, Sequence[str]]) -> None:
        """Collisions of a graph: ``(asked span id, chosen span id, group)``;
        ``tags_of`` gives the tags of the chosen spans."""
        for asked, chosen, group in collisions:
            if (asked, chosen) in self._said:
                continue
            chosen_tags = tuple(tags_of.get(chosen) or (chosen,))
            asked_tags = self._tags.get(asked)
            if asked_tags is None:
                self._waiting.remember(asked, (chosen_tags, chosen, group))
            else:
                self._say(asked, asked_tags, chosen, chosen_tags, group)

    def notice(self, msg: object) -> None:
        """A close notice (or a batch): the tags of the blocks it names (as it came:
        one not of the helper's shape is skipped)."""
        for notice in msg if isinstance(msg, (list, tuple)) else (msg,):
            try:
                span_id, tags = str(notice["ids"][-1]), tuple(notice["name"])
            except (KeyError, IndexError, TypeError):
                continue  # (the tracker says the notice is malformed)
            self._tags.remember(span_id, tags)
            waiting = self._waiting.pop(span_id, None)
            if waiting is not None:
                chosen_tags, chosen, group = waiting
                self._say(span_id, tags, chosen, chosen_tags, group)

    def _say(self, asked: str, asked_tags: tuple[str, ...], chosen: str,
             chosen_tags: tuple[str, ...], group: str) -> None:
        self._said.remember((asked, chosen))
        now = self._clock()
        if now - self._window_start >= WINDOW:
            self._window_start, self._in_window = now, 0
        if self._in_window >= MAX_WARNINGS:
            self.suppressed += 1
            return
        self._in_window += 1
        self.said += 1
        more = (f" ({self.suppressed} more such collisions were not logged)"
                if self.suppressed else "")
        self.suppressed = 0
        logger.warning(
            "dask_otel_spans: tasks of span %r are counted in span %r: dask puts a "
            "task group in the span of its first tasks, and their group %r belongs "
            "to that span. Give the tasks of each span() block keys or names of "
            "their own (e.g. a name per block, or pure=True with distinct "
            "arguments)%s", _joined(asked_tags), _joined(chosen_tags), group, more,
        )

