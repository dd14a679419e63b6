"""Every use of distributed's private names, in one place: the attributes of
``distributed.spans.Span`` that the package reads (the scheduler's spans) and fills
(the export side's copy of them), and a check that the installed distributed still
has each, so that a release that renames one fails here, by name, not deep inside.
"""
from __future__ import annotations

from collections.abc import Hashable, MutableMapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distributed.client import SourceCode
    from distributed.spans import Span

#: The private attributes of ``distributed.spans.Span`` the package uses
SPAN_PRIVATE_ATTRIBUTES = (
    "_cumulative_worker_metrics",  # its own fine metrics, without its children's
    "_code",  # the client's source snippets (``include-code``)
    "_total_nthreads_history",  # the scheduler's thread-count history it refers to
    "_total_nthreads_offset",  # where in that history it began
)


def cumulative_metrics(span: Span) -> MutableMapping[Hashable, float]:
    """The span's own fine metrics ``{(context, prefix, activity, unit): value}``
    (without its children's), as distributed sums them; an empty dict where the
    span has none."""
    metrics = getattr(span, "_cumulative_worker_metrics", None)
    return metrics if metrics is not None else {}


def code_snippets(span: Span) -> MutableMapping[tuple[SourceCode, ...], None]:
    """The span's source code snippets, in the order the client sent them (an
    insertion-ordered dict of snippets); empty where it has none."""
    code = getattr(span, "_code", None)
    return code if code is not None else {}


def nthreads_history(span: Span) -> Sequence[tuple[float, int]]:
    """The scheduler's ``total_nthreads_history`` the span refers to."""
    return getattr(span, "_total_nthreads_history", ())


def nthreads_offset(span: Span) -> int:
    """Where in :func:`nthreads_history` the span began."""
    return getattr(span, "_total_nthreads_offset", 0)


def set_nthreads_offset(span: Span, offset: int) -> None:
    """Set where in :func:`nthreads_history` a span of the export side's copy
    began."""
    span._total_nthreads_offset = offset


def missing_private_names() -> list[str]:
    """The private names the package uses that the installed distributed lacks,
    each as ``distributed.spans.Span.<name>`` (empty when it has them all)."""
    from distributed.spans import Span

    span = Span(("probe",), "probe", None, [(0.0, 0)])
    return [f"distributed.spans.Span.{name}" for name in SPAN_PRIVATE_ATTRIBUTES
            if not hasattr(span, name)]
