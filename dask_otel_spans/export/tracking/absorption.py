"""The absorption of the W3C contexts that graphs carry: applied to the open spans of
the readiness tracker, remembered for the spans it does not know yet."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from dask_otel_spans import names
from dask_otel_spans.export.bounded import BoundedMemory
from dask_otel_spans.export.tracking.records import OpenSpan, merge_carried
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.propagation import carried_headers

if TYPE_CHECKING:
    from distributed.spans import Span

#: Ids carried by graphs before the tracker knew the span, remembered at most (their
#: close notice, which comes in most cases, forgets them)
MAX_REMEMBERED = 10_000


class CarriedContexts:
    """Apply the contexts graphs carried to the open spans.

    Parameters
    ----------
    open_spans:
        dask id -> record of the tracker's open spans (shared, not copied)
    spans:
        span id -> ``Span`` of the span tree copy (the spans not handed over yet)
    look_again:
        Has a record checked at the next pass
    log_once:
        Where bad annotations are said (once)
    """

    def __init__(self, open_spans: Mapping[str, OpenSpan], spans: Mapping[str, Span],
                 look_again: Callable[[OpenSpan], None], log_once: OnceLogger):
        self._open = open_spans
        self._spans = spans
        self._look_again = look_again
        self._log_once = log_once
        self._submitted_unknown: BoundedMemory[str, None] = BoundedMemory(MAX_REMEMBERED)

    def submitted_before(self, dask_id: str) -> bool:
        """Whether a graph carried ``dask_id`` before its span was open (forgotten
        once asked)."""
        return self._submitted_unknown.pop(dask_id, False) is None

    def absorb_chains(self, chains: object) -> None:
        """Apply the W3C contexts of an annotation's chains (each {dask id:
        headers}) to the open spans."""
        if isinstance(chains, Mapping):
            chains = list(chains.values())
        if not isinstance(chains, (list, tuple)):
            self._log_bad_annotation(chains)
            return
        # spans given their contexts by an earlier chain: the chains below a span
        # all carry the same contexts for it and its ancestors
        absorbed: set[str] = set()
        for chain in chains:
            if type(chain) is dict and self._chain_known(chain, absorbed):
                continue
            carried = carried_headers(chain)
            if carried is None:
                self._log_bad_annotation(chain)
                continue
            for dask_id in carried:
                if dask_id in absorbed or type(dask_id) is not str:
                    continue
                absorbed.add(dask_id)
                self._absorb(dask_id, carried)

    def carried_again(self, chains: object) -> None:
        """The contexts graphs carried for spans adopted from the scheduler (a new
        export process): taken as a graph's (:func:`merge_carried`), without what a
        graph's coming says (activity; a block that waits for its close notice: a
        notice that went to the export process before is not sent again)."""
        if not isinstance(chains, (list, tuple)):
            self._log_bad_annotation(chains)
            return
        for chain in chains:
            carried = carried_headers(chain)
            if carried is None:
                self._log_bad_annotation(chain)
                continue
            for dask_id in carried:
                rec = self._open.get(dask_id)
                if rec is not None:
                    merge_carried(rec, carried, self._open)

    def _absorb(self, dask_id: str, carried: dict[str, object]) -> None:
        """A graph carried the contexts ``carried`` of the chain of ``dask_id``."""
        rec = self._open.get(dask_id)
        if rec is not None:
            merge_carried(rec, carried, self._open)
            rec.helper = True
            rec.submitted = True
            if rec.span is None:
                # its tasks went to another span's group: its wait for a graph is
                # over
                self._look_again(rec)
        elif dask_id not in self._spans:
            self._submitted_unknown.remember(dask_id)

    def _chain_known(self, chain: dict[str, object], absorbed: set[str]) -> bool:
        """Whether every span of a carried ``chain`` not absorbed yet is open with
        its own context from its close notice (which carried this very chain):
        then only the graph's coming is news."""
        known = []
        for dask_id in chain:
            if dask_id in absorbed:
                continue
            rec = self._open.get(dask_id)
            if rec is None or not rec.helper or dask_id not in rec.carried:
                return False
            own = rec.carried[dask_id]
            carrier = chain[dask_id]
            if carrier is not own and carrier != own:
                return False  # (another context for it: a link)
            known.append(rec)
        for rec in known:
            absorbed.add(rec.id)
            rec.submitted = True
            if rec.span is None:
                self._look_again(rec)
        return True

    def _log_bad_annotation(self, value: object) -> None:
        self._log_once(
            "bad-annotation", "ignoring an %r annotation that is not a mapping of dask "
            "span id to W3C headers: %.200r", names.ANNOTATION_KEY, value,
        )
