"""The profiles of prefix spans on the export side: the workers' trees, gathered per
dask span and prefix as they come (window by window), the spans that wait for them,
and what lands on each prefix span (``dask.profile.*``)."""
from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dask_otel_spans import names
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.profiles import (
    ROOT,
    Node,
    capped,
    hottest,
    merge_into,
    profile_file,
    read_tree,
    speedscope_json,
)

if TYPE_CHECKING:
    from opentelemetry.util.types import AttributeValue

    from dask_otel_spans.export.ender import HandOver
    from dask_otel_spans.export.traces import SpanFields

logger = logging.getLogger(__name__)


@dataclass
class PrefixProfile:
    """A prefix's profile in one dask span, over the windows received."""

    tree: Node = field(default_factory=lambda: Node(ROOT))
    #: the most other spans that ran the prefix in a window
    shared_spans: int = 0
    #: what could not be had, in words (one entry per window that missed some)
    missing: list[str] = field(default_factory=list)
    #: windows received; the first window's start and the last one's stop
    windows: int = 0
    start: float = 0.0
    stop: float = 0.0
    #: stacks left out past ``profile.max-stacks``
    stacks_left_out: int = 0

    def attributes(self) -> dict[str, AttributeValue]:
        """``dask.profile.*`` of the prefix span."""
        out: dict[str, AttributeValue] = {names.PROFILE_SAMPLES: self.tree.total}
        top = hottest_of(self.tree)
        if top:
            out[names.PROFILE_TOP] = top
        if self.shared_spans:
            out[names.PROFILE_SHARED_SPANS] = self.shared_spans
        if self.missing:
            out[names.PROFILE_MISSING] = "; ".join(self.missing)
        return out


def hottest_of(tree: Node) -> list[str]:
    """``dask.profile.top`` of a tree."""
    return hottest(tree, names.PROFILE_TOP_FUNCTIONS)


class ProfileBook:
    """Profiles per dask span and prefix until their span is handed over, and the
    spans that wait for one.

    Parameters
    ----------
    max_stacks:
        ``profile.max-stacks``: distinct stacks kept per prefix
    """

    def __init__(self, max_stacks: int):
        self.max_stacks = max_stacks
        self._profiles: dict[str, dict[str, PrefixProfile]] = {}
        #: span id -> prefix -> until when the span waits for that prefix's profile
        self._pending: dict[str, dict[str, float]] = {}
        self._log_once = OnceLogger(logger)
        #: trees that could not be read (skipped)
        self.unreadable = 0

    def pending(self, span_id: str, prefix: str, until: float) -> None:
        """The span waits for a profile of ``prefix`` until ``until``."""
        self._pending.setdefault(span_id, {})[prefix] = until

    def held_until(self, span_id: str) -> float | None:
        """Until when the span waits for profiles; None when it waits for none."""
        waits = self._pending.get(span_id)
        return max(waits.values()) if waits else None

    def add(self, span_id: str, prefix: str, start: float, stop: float,
            trees: Sequence[Mapping[str, object]], shared_spans: int, missing: str,
            final: bool) -> bool:
        """A window of a prefix's profile; True when it was the last the span waited
        for (it may be handed over now)."""
        profile = self._profiles.setdefault(span_id, {}).get(prefix)
        if profile is None:
            profile = self._profiles[span_id][prefix] = PrefixProfile(start=start)
        for raw in trees:
            try:
                merge_into(profile.tree, read_tree(raw))
            except (ValueError, RecursionError) as e:
                self.unreadable += 1
                self._log_once("unreadable", "skipping a worker's profile of %r that "
                               "is not a profile tree (%s; logged once)", prefix, e)
        profile.tree, left_out = capped(profile.tree, self.max_stacks)
        profile.stacks_left_out += left_out
        profile.windows += 1
        profile.start = min(profile.start, start) if profile.start else start
        profile.stop = max(profile.stop, stop)
        profile.shared_spans = max(profile.shared_spans, int(shared_spans))
        if missing:
            profile.missing.append(str(missing))
        if not final:
            return False
        waits = self._pending.get(span_id)
        if waits is None or waits.pop(prefix, None) is None:
            return False
        if waits:
            return False
        del self._pending[span_id]
        return True

    def take(self, span_id: str) -> dict[str, PrefixProfile] | None:
        """The profiles of a span handed over (forgotten here)."""
        self._pending.pop(span_id, None)
        return self._profiles.pop(span_id, None)

    def __len__(self) -> int:
        """Spans with profiles or waits."""
        return len(self._profiles.keys() | self._pending.keys())


def apply_profiles(fields: SpanFields, profiles: Mapping[str, PrefixProfile]) -> None:
    """Put each prefix's ``dask.profile.*`` on its prefix span."""
    for prefix in fields.prefixes:
        profile = profiles.get(str(prefix.attributes.get(names.TASK_PREFIX,
                                                         prefix.name)))
        if profile is not None:
            prefix.attributes.update(profile.attributes())


def with_profiles(requests: list[HandOver], book: ProfileBook) -> list[HandOver]:
    """The requests, each with its span's profiles (taken from ``book``)."""
    out = []
    for request in requests:
        profiles = book.take(request.ids[-1])
        out.append(request if profiles is None else request._replace(profiles=profiles))
    return out


def write_profiles(directory: str, fields: SpanFields,
                   profiles: Mapping[str, PrefixProfile]) -> str | None:
    """Write the profiles of a dask span's prefixes (those with samples) as one
    speedscope file, a profile per prefix span named after it; returns its path
    (None when no prefix has samples). Written whole or not at all."""
    named = []
    for prefix in fields.prefixes:
        key = str(prefix.attributes.get(names.TASK_PREFIX, prefix.name))
        profile = profiles.get(key)
        if profile is not None and profile.tree.total:
            named.append((f"{key} ({fields.name})", profile.tree))
    if not named:
        return None
    ids = fields.ids
    path = profile_file(directory, ids.trace_id, ids.span_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = speedscope_json(named, f"{fields.name} ({ids.trace_id:032x}-"
                           f"{ids.span_id:016x})", f"dask_otel_spans {names.VERSION}")
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(partial, path)
    return path
