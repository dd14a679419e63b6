"""Pure translation of dask span snapshots into OTel span fields (names, times in ns,
ids, attributes); no I/O, no OpenTelemetry SDK objects, no live scheduler state."""
from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

from dask_otel_spans import names
from dask_otel_spans.export.task_spans import TaskSpanFields, task_span_fields
from dask_otel_spans.protocol.exceptions import OTHER
from dask_otel_spans.protocol.propagation import ChainIds, prefix_span_id

if TYPE_CHECKING:
    from distributed.client import SourceCode
    from opentelemetry.trace import SpanContext
    from opentelemetry.util.types import AttributeValue

    from dask_otel_spans.protocol.snapshots import GroupSnapshot, SpanSnapshot


def to_ns(seconds: float) -> int:
    """Scheduler clock (seconds since the epoch) to OTel nanoseconds."""
    return int(round(seconds * 1e9))


#: Distinct metric keys and attribute names remembered (they recur in every span)
_KEY_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=_KEY_CACHE_SIZE)
def metric_attribute(activity: str, unit: str) -> str:
    """``dask.metrics.<activity>.<unit>``"""
    return f"{names.METRICS_ATTRIBUTE_PREFIX}{activity}.{unit}"


@functools.lru_cache(maxsize=_KEY_CACHE_SIZE)
def split_metric_key(key: Hashable) -> tuple[str, str, str, str] | None:
    """``(context, prefix or where, activity, unit)`` of a per-span heartbeat key
    without its span id, or None when it does not have that shape."""
    if not isinstance(key, tuple) or len(key) < 3:
        return None
    context = str(key[0])
    where = str(key[1]) if len(key) >= 4 else ""
    return context, where, str(key[-2]), str(key[-1])


@dataclass(slots=True)
class SpanSummary:
    """Additive figures of a span, or of a span tree once children were added."""

    task_count: int = 0
    erred_count: int = 0
    nbytes_total: int = 0
    task_duration: float = 0.0
    #: earliest start of a task group, 0 when none finished a task
    start: float = 0.0
    #: latest stop of a task group, 0 when none
    stop: float = 0.0
    #: ``(activity, unit) -> value`` over every context and prefix
    metrics: dict[tuple[str, str], float] = field(default_factory=dict)
    #: sum of the known ``execute`` seconds (for the idle activity)
    execute_seconds: float = 0.0
    #: ``exception.type -> count`` of the tasks that erred while they ran
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, other: SpanSummary) -> None:
        self.task_count += other.task_count
        self.erred_count += other.erred_count
        for kind, n in other.errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + n
        self.nbytes_total += other.nbytes_total
        self.task_duration += other.task_duration
        if other.start and (not self.start or other.start < self.start):
            self.start = other.start
        self.stop = max(self.stop, other.stop)
        for k, v in other.metrics.items():
            self.metrics[k] = self.metrics.get(k, 0) + v
        self.execute_seconds += other.execute_seconds


def _group_figures(groups: Iterable[GroupSnapshot]) -> SpanSummary:
    task_count = erred_count = nbytes_total = 0
    duration = start = stop = 0.0
    errors: dict[str, int] = {}
    for tg in groups:
        task_count += tg.task_count
        erred_count += tg.erred_count
        for kind, n in tg.errors:
            errors[kind] = errors.get(kind, 0) + n
        nbytes_total += tg.nbytes_total
        duration += tg.duration
        if tg.start and (not start or tg.start < start):
            start = tg.start
        if tg.stop > stop:
            stop = tg.stop
    return SpanSummary(task_count, erred_count, nbytes_total, duration, start, stop,
                       {}, 0.0, errors)


def own_summary(span: SpanSnapshot) -> SpanSummary:
    """Figures of the span's own task groups and own worker metrics."""
    out = _group_figures(span.groups)
    metrics: dict[tuple[str, str], float] = {}
    for key, value in span.metrics.items():
        parts = split_metric_key(key)
        if parts is None or not isinstance(value, (int, float)):
            continue
        context, _, activity, unit = parts
        metrics[activity, unit] = metrics.get((activity, unit), 0) + value
        if context == "execute" and unit == "seconds":
            out.execute_seconds += value
    out.metrics = metrics
    return out


def subtree_summary(
    span: SpanSnapshot, known: Mapping[str, SpanSummary]
) -> SpanSummary:
    """Figures of the span tree below ``span``. Children given by id take their
    subtree summary from ``known`` (children handed over earlier); a missing one counts
    as empty."""
    out = own_summary(span)
    for child in span.children:
        if isinstance(child, str):
            cached = known.get(child)
            if cached is not None:
                out.add(cached)
        else:
            out.add(subtree_summary(child, known))
    return out


def active_cpu_seconds(
    nthreads_history: Sequence[tuple[float, int]],
    offset: int,
    start: float,
    stop: float,
) -> float:
    """Thread-seconds the cluster offered between ``start`` and ``stop``.

    Same definition as ``Span.active_cpu_seconds``, computed from the scheduler's
    ``total_nthreads_history`` without walking the span tree.
    """
    if stop <= start or offset >= len(nthreads_history):
        return 0.0
    prev_t, prev_n = start, nthreads_history[offset][1]
    total = 0.0
    for t, n in islice(nthreads_history, offset + 1, None):
        if t >= stop:
            break
        t = max(t, start)
        total += (t - prev_t) * prev_n
        prev_t, prev_n = t, n
    total += (stop - prev_t) * prev_n
    return total


def code_attribute(code: Iterable[tuple[SourceCode, ...]], max_length: int) -> str:
    """Client code snippets of a span as one string, cut to ``max_length``."""
    parts = []
    for snippet in code:
        if not snippet:
            continue
        frame = snippet[-1]
        filename = getattr(frame, "filename", "?")
        lineno = getattr(frame, "lineno_frame", "?")
        parts.append(f"# {filename}:{lineno}\n{getattr(frame, 'code', frame)}")
    return "\n".join(parts)[:max_length]


@dataclass(slots=True)
class PrefixSpanFields:
    """Fields of the child span of one task prefix."""

    name: str
    span_id: int
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    #: its task spans (``task-spans``)
    tasks: list[TaskSpanFields] = field(default_factory=list)
    #: set when tasks erred: the status description
    error: str | None = None


@dataclass(slots=True)
class SpanFields:
    """Everything needed to end the OTel span of one dask span."""

    name: str
    ids: ChainIds
    start_ns: int
    end_ns: int
    attributes: dict[str, AttributeValue]
    #: set when tasks erred: the status description
    error: str | None
    prefixes: list[PrefixSpanFields]
    #: task spans right below it (without prefix spans)
    tasks: list[TaskSpanFields] = field(default_factory=list)
    #: span contexts it links to: callers of bare submissions that landed in it
    links: list[SpanContext] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def span_display_name(tags: Sequence[str]) -> str:
    """OTel span name: the last tag."""
    return str(tags[-1]) if tags else names.DEFAULT_SPAN_TAG


def _base_attributes(
    tags: Sequence[str], dask_id: str, summary: SpanSummary, active_cpu: float
) -> dict[str, AttributeValue]:
    return {
        names.SPAN_NAME: [str(t) for t in tags],
        names.SPAN_ID: str(dask_id),
        names.SPAN_TASK_COUNT: summary.task_count,
        names.SPAN_ERRED_COUNT: summary.erred_count,
        names.SPAN_NBYTES_TOTAL: summary.nbytes_total,
        names.SPAN_TASK_DURATION: summary.task_duration,
        names.SPAN_ACTIVE_CPU_SECONDS: active_cpu,
    }


def error_description(summary: SpanSummary) -> str | None:
    """The status description of a span whose tasks erred: how many, and of which
    exception types (the most frequent first, a few)."""
    if not summary.erred_count:
        return None
    n = summary.erred_count
    text = f"{n} task{'s' if n != 1 else ''} erred"
    ranked = _ranked(summary.errors)
    if ranked:
        shown = ranked[:names.MAX_ERROR_TYPES_DESCRIBED]
        text += ": " + ", ".join(f"{count} {kind}" for kind, count in shown)
        rest = sum(count for _, count in ranked[len(shown):])
        if rest:
            text += f", {rest} of {len(ranked) - len(shown)} other type" + (
                "s" if len(ranked) - len(shown) != 1 else "")
    return text


def _ranked(errors: Mapping[str, int]) -> list[tuple[str, int]]:
    return sorted(errors.items(), key=lambda item: (-item[1], item[0]))


def error_type(summary: SpanSummary) -> str | None:
    """``error.type`` of a span whose tasks erred: the most frequent exception type
    of those that erred while they ran (ties: by name); ``_OTHER`` when none is
    known (they erred because a dependency did, in another span)."""
    if not summary.erred_count:
        return None
    ranked = _ranked(summary.errors)
    return ranked[0][0] if ranked else OTHER


def prefix_fields(
    span: SpanSnapshot, *, default_start: float, default_stop: float,
    record_exceptions: bool = True,
) -> list[PrefixSpanFields]:
    """One child span per task prefix among the span's own groups (merged), with
    the task spans of the tasks the span kept of it. Its times are those of its
    groups' compute (the span tree copy's groups count their erred tasks in);
    a prefix none of whose tasks reported a compute takes ``default_start`` and
    ``default_stop``."""
    by_prefix: dict[str, list[GroupSnapshot]] = defaultdict(list)
    for tg in span.groups:
        by_prefix[tg.prefix].append(tg)
    if not by_prefix:
        return []
    metrics: dict[str, dict[str, float]] = defaultdict(dict)
    for key, value in span.metrics.items():
        parts = split_metric_key(key)
        if parts is None or parts[0] != "execute" or parts[1] not in by_prefix:
            continue
        attr = metric_attribute(parts[2], parts[3])
        per_prefix = metrics[parts[1]]
        per_prefix[attr] = per_prefix.get(attr, 0) + value
    out = []
    for prefix, groups in sorted(by_prefix.items()):
        fig = _group_figures(groups)
        start = fig.start or default_start
        stop = max(fig.stop or default_stop, start)
        attributes: dict[str, AttributeValue] = {
            names.TASK_PREFIX: prefix,
            names.TASK_GROUP_COUNT: len(groups),
            names.TASK_GROUP_TASK_COUNT: fig.task_count,
            names.TASK_GROUP_NBYTES_TOTAL: fig.nbytes_total,
        }
        attributes.update(metrics.get(prefix, {}))
        kind = error_type(fig)
        if kind is not None:
            attributes[names.ERROR_TYPE] = kind
        records, left_out = span.tasks.get(prefix, ((), 0))
        if left_out:
            attributes[names.TASK_SPANS_LEFT_OUT] = left_out
        tasks = task_span_fields(
            span.id, prefix, records, default_start=start, default_stop=stop,
            record_exceptions=record_exceptions,
        ) if records else []
        out.append(
            PrefixSpanFields(
                name=prefix,
                span_id=prefix_span_id(span.id, prefix),
                start_ns=to_ns(start),
                # (it covers its task spans, whatever the groups' figures say)
                end_ns=_covering(to_ns(stop), tasks),
                attributes=attributes,
                tasks=tasks,
                error=error_description(fig) if fig.erred_count else None,
            )
        )
    return out


def _covering(end_ns: int, *below: Sequence[PrefixSpanFields | TaskSpanFields]) -> int:
    """``end_ns``, or the latest end of the spans ``below`` when later."""
    for spans in below:
        if spans:
            end_ns = max(end_ns, max([s.end_ns for s in spans]))
    return end_ns


def own_task_fields(
    span: SpanSnapshot, *, default_start: float, default_stop: float,
    record_exceptions: bool = True,
) -> tuple[list[TaskSpanFields], int]:
    """The task spans of every prefix of the span (without prefix spans), and how
    many tasks were left out past the caps."""
    tasks: list[TaskSpanFields] = []
    left_out = 0
    for prefix, (records, n) in sorted(span.tasks.items()):
        left_out += n
        tasks.extend(task_span_fields(
            span.id, prefix, records, default_start=default_start,
            default_stop=default_stop, record_exceptions=record_exceptions,
        ))
    return tasks, left_out


def span_fields(
    span: SpanSnapshot,
    ids: ChainIds,
    summary: SpanSummary,
    *,
    now: float,
    complete: bool,
    close_reason: str,
    prefix_spans: bool = True,
    code_max_length: int | None = None,
    record_exceptions: bool = True,
) -> SpanFields:
    """OTel fields of a dask span the scheduler knows.

    Parameters
    ----------
    span:
        Snapshot of the dask span, see :func:`~dask_otel_spans.protocol.snapshots.snapshot_span`
    ids:
        Its OTel identity, see :func:`~dask_otel_spans.protocol.propagation.resolve_chain`
    summary:
        Figures of its whole tree, see :func:`subtree_summary`
    now:
        Current scheduler time: the end of a span that is not done
    complete:
        False when the span is handed over before it was done and closed (shutdown);
        sets ``dask.span.incomplete``
    close_reason:
        One of the ``names.CLOSE_REASON_*``
    prefix_spans:
        Whether to build one child span per task prefix
    code_max_length:
        Include the snapshot's code cut to this length; None leaves it out
    record_exceptions:
        Put the message and stack trace of erred tasks' exceptions on their spans
    """
    start = span.enqueued
    stop = summary.stop if complete and summary.stop else now
    stop = max(stop, start)
    active_cpu = active_cpu_seconds(
        span.nthreads_history, span.nthreads_offset, start, stop
    )
    attributes = _base_attributes(span.name, span.id, summary, active_cpu)
    for (activity, unit), value in summary.metrics.items():
        attributes[metric_attribute(activity, unit)] = value
    idle = max(0.0, active_cpu - summary.execute_seconds)
    idle_attr = metric_attribute(names.IDLE_ACTIVITY, "seconds")
    # (a metric attribute, set just above if at all: a number)
    attributes[idle_attr] = attributes.get(idle_attr, 0) + idle  # type: ignore[operator]
    attributes[names.SPAN_CLOSE_REASON] = close_reason
    kind = error_type(summary)
    if kind is not None:
        attributes[names.ERROR_TYPE] = kind
    if not complete:
        attributes[names.SPAN_INCOMPLETE] = True
    if code_max_length is not None:
        code = code_attribute(span.code, code_max_length)
        if code:
            attributes[names.SPAN_CODE] = code
    prefixes: list[PrefixSpanFields] = []
    tasks: list[TaskSpanFields] = []
    if prefix_spans:
        prefixes = prefix_fields(span, default_start=start, default_stop=stop,
                                 record_exceptions=record_exceptions)
    else:
        tasks, left_out = own_task_fields(span, default_start=start, default_stop=stop,
                                          record_exceptions=record_exceptions)
        if left_out:
            attributes[names.TASK_SPANS_LEFT_OUT] = left_out
    return SpanFields(
        name=span_display_name(span.name),
        ids=ids,
        start_ns=to_ns(start),
        # (it covers its own task spans, whatever the groups' figures say)
        end_ns=_covering(to_ns(stop), prefixes, tasks),
        attributes=attributes,
        error=error_description(summary),
        prefixes=prefixes,
        tasks=tasks,
    )


def unseen_span_fields(
    tags: Sequence[str],
    dask_id: str,
    ids: ChainIds,
    *,
    enter: float,
    exit: float,
    close_reason: str,
) -> SpanFields:
    """OTel fields of a span the scheduler never saw (no tasks anywhere below it):
    it takes the client's enter and exit times."""
    exit = max(exit, enter)
    attributes = _base_attributes(tags, dask_id, SpanSummary(), 0.0)
    attributes[names.SPAN_CLOSE_REASON] = close_reason
    return SpanFields(
        name=span_display_name(tags),
        ids=ids,
        start_ns=to_ns(enter),
        end_ns=to_ns(exit),
        attributes=attributes,
        error=None,
        prefixes=[],
    )
