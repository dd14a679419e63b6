"""What the readiness tracker takes of the client helper's close notices, which any
client may send with anything in them: each notice read and its times checked
(:func:`~dask_otel_spans.protocol.notices.read_notice`), the spans notices open
before the scheduler saw them bounded per client and in all, one close notice per
span; what is left out said once per client, never per notice."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from dask_otel_spans import names
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.notices import (
    MAX_BLOCK_SECONDS,
    MAX_CLOCK_SKEW,
    read_notice,
)

if TYPE_CHECKING:
    from dask_otel_spans.protocol.notices import CloseNoticeFields

logger = logging.getLogger(__name__)

#: Spans one client's close notices may hold open before the scheduler saw them (a
#: block without tasks, or whose graph has not come yet); the notices past it are
#: ignored until some of them are handed over
MAX_NOTICE_SPANS_PER_CLIENT = 10_000
#: The same, all clients together (the ``client`` a notice names is the client's word)
MAX_NOTICE_SPANS = 20_000
#: And over time: spans one client's notices may open per second, past a burst of
#: :data:`MAX_NOTICE_SPANS_PER_CLIENT` (each span they open is exported: a client
#: sending notices without end would keep the export side busy for every client)
NOTICE_SPANS_PER_SECOND = 100.0
#: Clients whose rate is followed at once (past them, new clients wait until one
#: has its whole burst again)
MAX_CLIENTS_FOLLOWED = 1_024
#: Clients whose notices are said by name; past them, once for all
MAX_CLIENTS_SAID = 16
#: Clients whose spans waiting on them alone are counted by name in the figures (the
#: others' count in the total only)
MAX_CLIENTS_COUNTED = 64


class NoticeGate:
    """Read close notices for the readiness tracker and bound what they open.

    :meth:`read` reads one (None: not of the helper's shape, said once);
    :meth:`may_open` is asked before a notice opens a span the tracker does not have,
    :meth:`closed_again` when it names a span a notice closed already (ignored),
    and :meth:`handed_over` for every span handed over.

    Parameters
    ----------
    per_client, total:
        Spans opened by notices and not handed over yet, per client and in all
    per_second:
        Spans one client's notices may open per second, past a burst of
        ``per_client``
    """

    def __init__(self, per_client: int = MAX_NOTICE_SPANS_PER_CLIENT,
                 total: int = MAX_NOTICE_SPANS,
                 per_second: float = NOTICE_SPANS_PER_SECOND):
        self.per_client = per_client
        self.total = total
        self.per_second = per_second
        self._rates = _Rates(per_client, per_second)
        #: span id -> the client whose notice opened it, of the spans open
        self._opened_by: dict[str, str | None] = {}
        self._per_client: dict[str | None, int] = {}
        #: of those, the spans the scheduler has not seen (no task): they wait for
        #: their client alone (its graph, or their idle or lazy timeout)
        self._unseen: dict[str, str | None] = {}
        self._unseen_per_client: dict[str | None, int] = {}
        self._log_once = OnceLogger(logger)
        self._said: dict[str, set[str | None]] = {}
        #: notices (or their spans) ignored: past the bounds, and closing a span again
        self.ignored = 0
        #: notices whose times were not possible (their spans take the arrival time)
        self.times_ignored = 0

    @property
    def open_count(self) -> int:
        """Spans opened by notices and not handed over yet."""
        return len(self._opened_by)

    def read(self, msg: object, received: float) -> CloseNoticeFields | None:
        """The fields of a close notice the scheduler got at ``received`` (its
        clock); None for one not of the helper's shape (said once)."""
        try:
            # (as it came: read_notice checks it, and raises for one not of the
            # helper's shape)
            notice = read_notice(msg, received)  # type: ignore[arg-type]
        except Exception as e:
            self._log_once(
                "bad-notice", "ignoring a malformed close notice on topic %r (%s): "
                "%.200r", names.EVENT_TOPIC, e, msg,
            )
            return None
        if notice.times_ignored:
            self.times_ignored += 1
            self._say(
                "times", notice.client, "close notices of client %s carry times that "
                "cannot be (the first: enter %r, exit %r, received %r on the "
                "scheduler's clock; possible: numbers in order, no later than their "
                "arrival by more than %g s, no earlier by more than %g days); their "
                "times are ignored: a span without tasks takes the time the scheduler "
                "got its notice (said once per client)",
                msg.get("enter"), msg.get("exit"), received,  # type: ignore[attr-defined]
                MAX_CLOCK_SKEW, MAX_BLOCK_SECONDS / 86_400)
        return notice

    def may_open(self, client: str | None, span_id: str, now: float) -> bool:
        """Whether a notice of ``client`` that came at ``now`` (the scheduler's
        clock) may open span ``span_id`` (counted when it may); past the bounds it
        is ignored, said once per client."""
        n = self._per_client.get(client, 0)
        if (n >= self.per_client or len(self._opened_by) >= self.total
                or not self._rates.take(client, now)):
            self.ignored += 1
            self._say(
                "bound", client, "client %s sent close notices for more spans the "
                "scheduler has not seen than are kept (%d per client and %d in all not "
                "handed over yet, %g per second per client past that many); ignoring "
                "its notices for such spans for now (their spans, if any task comes, "
                "close when idle or when the client leaves)", self.per_client,
                self.total, self.per_second)
            return False
        self._per_client[client] = n + 1
        self._opened_by[span_id] = client
        self._unseen[span_id] = client
        _count(self._unseen_per_client, client, 1)
        return True

    def seen(self, span_id: str) -> None:
        """The scheduler saw span ``span_id`` (a task of it came): it no longer waits
        for its client alone."""
        if span_id in self._unseen:
            _count(self._unseen_per_client, self._unseen.pop(span_id), -1)

    def waiting_on_clients(self) -> tuple[int, dict[str, int]]:
        """The open spans opened by notices that the scheduler has not seen, which
        wait for their client alone: how many, and how many per named client (the
        first :data:`MAX_CLIENTS_COUNTED` clients)."""
        per_client: dict[str, int] = {}
        for client, n in self._unseen_per_client.items():
            if len(per_client) >= MAX_CLIENTS_COUNTED:
                break
            if client is not None:
                per_client[client] = n
        return len(self._unseen), per_client

    def closed_again(self, client: str | None) -> None:
        """A notice of ``client`` names a span a close notice closed already: ignored
        (a span takes its first close notice), said once per client."""
        self.ignored += 1
        self._say("again", client, "client %s sent another close notice for spans "
                  "closed already; a span takes its first close notice, the others "
                  "are ignored")

    def handed_over(self, span_id: str) -> None:
        """Span ``span_id`` was handed over: it no longer counts."""
        if span_id not in self._opened_by:
            return
        _count(self._per_client, self._opened_by.pop(span_id), -1)
        self.seen(span_id)

    def _say(self, kind: str, client: str | None, msg: str, *args: object) -> None:
        """A WARNING once per ``kind`` and client, for the first
        :data:`MAX_CLIENTS_SAID` clients; then once for all others."""
        said = self._said.setdefault(kind, set())
        if client in said:
            return
        if len(said) >= MAX_CLIENTS_SAID:
            self._log_once(f"{kind}:more", "more clients sent close notices %s; not "
                           "said for each", _WHAT[kind])
            return
        said.add(client)
        logger.warning("dask_otel_spans: " + msg,
                       repr(client) if client is not None else "(unnamed)", *args)


class _Rates:
    """Per client, how many spans its notices may open now: ``burst`` at first,
    taken one per span, given back at ``per_second`` up to ``burst`` (a token
    bucket); :data:`MAX_CLIENTS_FOLLOWED` clients at once."""

    def __init__(self, burst: int, per_second: float):
        self.burst, self.per_second = burst, per_second
        #: client -> (spans it may open, at when)
        self._left: dict[str | None, tuple[float, float]] = {}

    def take(self, client: str | None, now: float) -> bool:
        """Whether a notice of ``client`` may open a span at ``now`` (taken)."""
        left, at = self._left.get(client, (self.burst, now))
        left = min(self.burst, left + max(0.0, now - at) * self.per_second)
        if client not in self._left and len(self._left) >= MAX_CLIENTS_FOLLOWED:
            self._forget_full(now)
            if len(self._left) >= MAX_CLIENTS_FOLLOWED:
                return False
        if left < 1:
            self._left[client] = (left, now)
            return False
        self._left[client] = (left - 1, now)
        return True

    def _forget_full(self, now: float) -> None:
        """Forget the clients whose whole burst is back (as if never seen)."""
        for client, (left, at) in list(self._left.items()):
            if left + (now - at) * self.per_second >= self.burst:
                del self._left[client]


def _count(counts: dict[str | None, int], client: str | None, change: int) -> None:
    """Add ``change`` to the count of ``client`` (a count of 0 is forgotten)."""
    n = counts.pop(client, 0) + change
    if n:
        counts[client] = n


#: What a kind of warning says of the notices, for the line that covers more clients
_WHAT = {"times": "with times that cannot be (their times ignored)",
         "bound": "past the bound on spans opened by notices (ignored)",
         "again": "for spans closed already (ignored)"}
