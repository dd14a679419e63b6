"""Delivery: the encoded batches of the holding exporters
(:mod:`~dask_otel_spans.sdk.holding`) wait in the :class:`~dask_otel_spans.sdk.spool.Spool`,
bound to their destination, and one thread of its own sends them, oldest first per
destination, each to its own; what the receiver did not
take is held and sent again, with backoff between attempts (the server's ``RetryInfo`` /
``Retry-After`` when it gave one), until the receiver acknowledges it. The one engine
behind every holding exporter and ``dask-otel-spans resend``
(:mod:`~dask_otel_spans.sdk.resend`)."""
from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence

from dask_otel_spans.protocol.figures import SignalFigures
from dask_otel_spans.protocol.outcome import UNITS
from dask_otel_spans.sdk.destination import Destination
from dask_otel_spans.sdk.health import ExportHealth
from dask_otel_spans.sdk.otlpsend import Reply, RequestSender
from dask_otel_spans.sdk.spool import Entry, Spool
from dask_otel_spans.sdk.spooltakeover import Accept, Left
from dask_otel_spans.wording import counted

logger = logging.getLogger(__name__)

#: Seconds before the first new attempt after a failed one; doubled each time
BACKOFF_START = 1.0
#: The longest wait between two attempts of our own choosing
BACKOFF_MAX = 2.0
#: The longest wait a server's retry hint may ask for
RETRY_HINT_MAX = 300.0
#: Seconds between two looks at what is due (spilling to disk, backoff ends)
_TICK = 0.25


def backoff(attempt: int) -> float:
    """Seconds to wait after the ``attempt``-th failed attempt in a row (from 1):
    doubling from :data:`BACKOFF_START` to :data:`BACKOFF_MAX`, ±20 % jitter."""
    return min(BACKOFF_MAX, BACKOFF_START * 2 ** (attempt - 1)) * random.uniform(0.8, 1.2)


#: Attempts a flush waits for while the backend takes nothing (1 + 2 + 2 s apart)
TRIES_IN_A_FLUSH = 3

class Delivery:
    """Send what ``spool`` holds, per destination, on a thread of its own.

    Parameters
    ----------
    spool:
        Where held batches wait
    """

    def __init__(self, spool: Spool):
        self.spool = spool
        #: by destination key: where its batches go, how, and their figures
        self._destinations: dict[str, Destination] = {}
        self._senders: dict[str, RequestSender] = {}
        self._health: dict[str, ExportHealth] = {}
        #: signal -> the key of the destination its batches are held for
        self._held_for: dict[str, str] = {}
        #: a batch is on its way and its outcome not counted yet
        self._sending = False
        self._retry_at: dict[str, float] = {}
        self._attempts: dict[str, int] = {}
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        #: the thread ended; it releases the spool (and the senders) as it ends,
        #: when a send was still in flight at close
        self._exit_lock = threading.Lock()
        self._exited = False
        self._release_at_exit = False
        #: requests the receiver acknowledged, and refused for good
        self.sent = 0
        self.refused = 0
        #: per destination key, the batch (stamp, size) whose last attempt went out
        #: and got no answer: the receiver may have taken it, and sending it again is
        #: a resend
        self._unanswered: dict[str, tuple[int, int]] = {}
        #: per destination key, items sent again after an attempt that got no answer
        self._resent: dict[str, int] = {}

    @property
    def signals(self) -> tuple[str, ...]:
        """The signals it sends (each once)."""
        return tuple(dict.fromkeys(d.signal for d in self._destinations.values()))

    @property
    def destinations(self) -> tuple[Destination, ...]:
        return tuple(self._destinations.values())

    def add_destination(self, destination: Destination, sender: RequestSender,
                        health: ExportHealth | None = None) -> None:
        """Send the batches held for ``destination`` with ``sender`` (built from the
        same configuration); count them in ``health``. The first destination of a
        signal is the one its batches handed to :meth:`hold` are held for."""
        key = destination.key
        self._destinations[key] = destination
        self._senders[key] = sender
        self._health[key] = health or ExportHealth(destination.signal, destination.shown)
        self._held_for.setdefault(destination.signal, key)

    def start(self, accept: Accept | None = None) -> None:
        """Open the spool and start the thread. Of the batches an export that ended
        left, those ``accept`` gives a destination of this delivery are sent first
        (by default those held for one of its destinations); the others stay where
        they are, said in one line."""
        self.spool.open(accept or self._own)
        said = left_elsewhere(self.spool.left, self.destinations, self.spool.directory)
        if said and accept is None:
            logger.warning("dask_otel_spans: %s", said)
        self._thread = threading.Thread(target=self._run, name="dask-otel-spans-delivery",
                                        daemon=True)
        self._thread.start()

    # -- the exporters' side -------------------------------------------------------------

    def hold(self, signal: str, payload: bytes, items: int) -> None:
        """Hold an encoded request for ``signal``'s destination until it acknowledges
        it (sent at once when nothing older for it waits)."""
        self.spool.put(self._destinations[self._held_for[signal]], payload, items)
        self._wake.set()

    def _own(self, signal: str, key: str | None,
             destination: Destination | None) -> Destination | None:
        """(:data:`~dask_otel_spans.sdk.spooltakeover.Accept`) Batches held for one of its
        destinations."""
        return self._destinations.get(key) if key is not None else None

    def waiting(self) -> bool:
        """Whether a batch for a destination this delivery sends to still waits (or
        is being sent, its outcome not counted yet)."""
        return self._sending or any(self.spool.waiting(s) for s in self._senders)

    def drain(self, timeout: float, until_refused: bool = False) -> bool:
        """Wait until nothing waits, at most ``timeout`` seconds (less when every
        destination that waits is not due again before then; with ``until_refused``,
        less when every one that waits was tried :data:`TRIES_IN_A_FLUSH` times since the
        wait began and the backend took none: a backend that is down is not waited
        for, one that is coming back gets its tries); True when nothing waits."""
        deadline = time.monotonic() + timeout
        attempts_before = dict(self._attempts)
        self._wake.set()
        while self.waiting():
            now = time.monotonic()
            waiting = [s for s in self._senders if self.spool.waiting(s)]
            due = [self._retry_at.get(s, 0.0) for s in waiting]
            if now >= deadline or (due and min(due) > deadline):
                return False
            if until_refused and waiting and all(
                    self._attempts.get(s, 0) - attempts_before.get(s, 0)
                    >= TRIES_IN_A_FLUSH
                    for s in waiting):
                return False
            time.sleep(min(0.05, deadline - now))
        return True

    def close(self, timeout: float) -> None:
        """Try to deliver what waits for at most ``timeout`` seconds, then stop and
        leave the rest in the spool's directory."""
        self.drain(timeout)
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(min(timeout, 1.0))
        with self._exit_lock:
            # (a send still in flight: its batch is written with the others, and
            # the folder is released once its answer is counted, not before: no
            # other process takes over and sends again a batch acknowledged here)
            in_flight = self._thread is not None and not self._exited
            self._release_at_exit = in_flight
            self.spool.close(release=not in_flight)
        if not in_flight:
            self._close_senders()

    def _close_senders(self) -> None:
        for sender in self._senders.values():
            try:
                sender.close()
            except Exception:
                pass

    def figures(self, signal: str, delivered: int | None = None,
                failed: int | None = None, destination: str | None = None
                ) -> SignalFigures:
        """What came of ``signal`` (of its destination of key ``destination`` only,
        when given): ``delivered`` and ``failed`` as its exporters counted them,
        with what this holds and dropped of it."""
        keys = [k for k, d in self._destinations.items() if d.signal == signal
                and destination in (None, k)]
        if not keys:
            return SignalFigures(delivered, failed)
        figures = [self.spool.figures(k) for k in keys]
        return SignalFigures(delivered, failed,
                             **{name: sum(f[name] for f in figures)
                                for name in ("held", "spooled", "dropped")},
                             resent=sum(self._resent.get(k, 0) for k in keys))

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._send_until_stopped()
        finally:
            with self._exit_lock:
                self._exited = True
                if self._release_at_exit:
                    self.spool.release()
                    self._close_senders()

    def _send_until_stopped(self) -> None:
        while not self._stopped.is_set():
            try:
                self.spool.spill_due()
                sent = False
                for key in list(self._senders):
                    if self._stopped.is_set():
                        return
                    sent = self._send_oldest(key) or sent
            except Exception:
                logger.exception("dask_otel_spans: the delivery thread failed a round")
                sent = False
            if not sent:
                self._wake.wait(self._wait())
                self._wake.clear()

    def _wait(self) -> float:
        now = time.monotonic()
        due = [t - now for s, t in self._retry_at.items() if self.spool.waiting(s)]
        return max(0.0, min([_TICK, *due]))

    def _send_oldest(self, key: str) -> bool:
        """Send the oldest batch held for the destination of key ``key`` if it is
        due; True when one left."""
        if time.monotonic() < self._retry_at.get(key, 0.0):
            return False
        entry = self.spool.oldest(key)
        if entry is None or entry.payload is None:
            return False
        sender = self._senders[key]
        if self._unanswered.get(key) == (entry.stamp, entry.size):
            # (at least once: the receiver may have it from the attempt before)
            self._resent[key] = self._resent.get(key, 0) + entry.items
            self._health[key].resend(sender.timeout)
        self._sending = True
        try:
            return self._sent(key, entry, sender.send(entry.payload))
        finally:
            self._sending = False

    def _sent(self, key: str, entry: Entry, reply: Reply) -> bool:
        """Count what came of sending ``entry``; True when it left the spool."""
        health = self._health[key]
        if reply.unanswered:
            self._unanswered[key] = (entry.stamp, entry.size)
        else:  # (an answer came: a later attempt adds no copy of this one)
            self._unanswered.pop(key, None)
        if reply.delivered:
            self.spool.done(entry)
            self.sent += 1
            self._attempts[key] = 0
            self._retry_at.pop(key, None)
            figures = self.spool.figures(key)
            health.record(True, entry.items, dropped=self.spool.recovered(key),
                          waiting=figures["held"] + figures["spooled"])
            return True
        if not reply.retryable:
            self.spool.done(entry)
            self.refused += 1
            health.refuse(entry.items, reply.reason)
            return True
        health.outage()
        attempts = self._attempts[key] = self._attempts.get(key, 0) + 1
        delay = (min(reply.retry_after, RETRY_HINT_MAX) if reply.retry_after is not None
                 else backoff(attempts))
        self._retry_at[key] = time.monotonic() + delay
        return False



def left_elsewhere(left: Sequence[Left], own: Sequence[Destination],
                   directory: str | None) -> str:
    """In words, the batches an export process found in the spool ``directory``
    and left there, held for other destinations than its ``own`` (endpoints without
    user info, no secret); empty when there are none."""
    parts = []
    mine = {d.key for d in own}
    for found in left:
        if found.key in mine:  # (a name taken twice: the next start takes it)
            continue
        unit = UNITS.get(found.signal, "item")
        what = (f"{counted(found.batches, 'batch', 'batches')} "
                f"({counted(found.items, unit)})")
        destination = found.destination
        if destination is None:
            parts.append(f"{what} of an unknown destination (written before batches "
                         "were bound to theirs, or its record is missing)")
            continue
        where = f"{destination.signal} to OTLP {destination.protocol} {destination.shown}"
        if any(d.same_endpoint(destination) for d in own):
            where += " with other credentials (headers, user info) than this export's"
        parts.append(f"{what} for {where}")
    if not parts:
        return ""
    return (f"the spool {directory} holds batches this export does not send, held for "
            f"other destinations: {'; '.join(parts)}; left there (dask-otel-spans "
            f"resend {directory} sends each to its own)")
