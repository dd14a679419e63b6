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
#: Clients whose notices are said by name; past them, once for all
MAX_CLIENTS_SAID = 16


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
    """

    def __init__(self, per_client: int = MAX_NOTICE_SPANS_PER_CLIENT,
                 total: int = MAX_NOTICE_SPANS):
        self.per_client = per_client
        self.total = total
        #: span id -> the client whose notice opened it, of the spans open
        self._opened_by: dict[str, str | None] = {}
        self._per_client: dict[str | None, int] = {}
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

    def may_open(self, client: str | None, span_id: str) -> bool:
        """Whether a notice of ``client`` may open span ``span_id`` (counted when
        it may); past the bounds it is ignored, said once per client."""
        n = self._per_client.get(client, 0)
        if n >= self.per_client or len(self._opened_by) >= self.total:
            self.ignored += 1
            self._say(
                "bound", client, "client %s sent close notices for more spans the "
                "scheduler has not seen than are kept (%d per client, %d in all, not "
                "handed over yet); ignoring its notices for such spans until some are "
                "handed over (their spans, if any task comes, close when idle or when "
                "the client leaves)", self.per_client, self.total)
            return False
        self._per_client[client] = n + 1
        self._opened_by[span_id] = client
        return True

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
        client = self._opened_by.pop(span_id)
        n = self._per_client.pop(client) - 1
        if n:
            self._per_client[client] = n

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


#: What a kind of warning says of the notices, for the line that covers more clients
_WHAT = {"times": "with times that cannot be (their times ignored)",
         "bound": "past the bound on spans opened by notices (ignored)",
         "again": "for spans closed already (ignored)"}
