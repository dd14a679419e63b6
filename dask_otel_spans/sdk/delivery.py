"""Delivery: the encoded batches of the holding exporters
(:mod:`~dask_otel_spans.sdk.holding`) wait in the :class:`~dask_otel_spans.sdk.spool.Spool`
and one thread of its own sends them, oldest first per signal; what the receiver did not
take is held and sent again, with backoff between attempts (the server's ``RetryInfo`` /
``Retry-After`` when it gave one), until the receiver acknowledges it. The one engine
behind every holding exporter and ``dask-otel-spans resend``."""
from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Mapping

from dask_otel_spans.protocol.figures import SIGNALS, SignalFigures
from dask_otel_spans.sdk.health import ExportHealth
from dask_otel_spans.sdk.otlpsend import Reply, RequestSender
from dask_otel_spans.sdk.spool import Entry, Spool

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
    """Send what ``spool`` holds, per signal, on a thread of its own.

    Parameters
    ----------
    spool:
        Where held batches wait
    """

    def __init__(self, spool: Spool):
        self.spool = spool
        self._senders: dict[str, RequestSender] = {}
        self._health: dict[str, ExportHealth] = {}
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
        #: per signal, the batch (stamp, size) whose last attempt went out and got
        #: no answer: the receiver may have taken it, and sending it again is a resend
        self._unanswered: dict[str, tuple[int, int]] = {}
        #: per signal, items sent again after an attempt that got no answer
        self._resent = dict.fromkeys(SIGNALS, 0)

    @property
    def signals(self) -> tuple[str, ...]:
        return tuple(self._senders)

    def add_signal(self, signal: str, sender: RequestSender,
                   health: ExportHealth | None = None) -> None:
        """Send ``signal``'s held batches with ``sender``; count them in ``health``."""
        self._senders[signal] = sender
        self._health[signal] = health or ExportHealth(signal, signal)

    def start(self) -> None:
        """Open the spool (batches left by an export that ended are sent first) and
        start the thread."""
        self.spool.open()
        self._thread = threading.Thread(target=self._run, name="dask-otel-spans-delivery",
                                        daemon=True)
        self._thread.start()

    # -- the exporters' side -------------------------------------------------------------

    def hold(self, signal: str, payload: bytes, items: int) -> None:
        """Hold an encoded request until the receiver acknowledges it (sent at once
        when nothing older of its signal waits)."""
        self.spool.put(signal, payload, items)
        self._wake.set()

    def waiting(self) -> bool:
        """Whether a batch of a signal this delivery sends still waits (or is being
        sent, its outcome not counted yet)."""
        return self._sending or any(self.spool.waiting(s) for s in self._senders)

    def drain(self, timeout: float, until_refused: bool = False) -> bool:
        """Wait until nothing waits, at most ``timeout`` seconds (less when every
        signal that waits is not due again before then; with ``until_refused``, less
        when every one that waits was tried :data:`TRIES_IN_A_FLUSH` times since the
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
                failed: int | None = None) -> SignalFigures:
        """What came of ``signal``: ``delivered`` and ``failed`` as its exporters
        counted them, with what this holds and dropped of it."""
        if signal not in self._senders:
            return SignalFigures(delivered, failed)
        return SignalFigures(delivered, failed, **self.spool.figures(signal),
                             resent=self._resent[signal])

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
                for signal in list(self._senders):
                    if self._stopped.is_set():
                        return
                    sent = self._send_oldest(signal) or sent
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

    def _send_oldest(self, signal: str) -> bool:
        """Send ``signal``'s oldest held batch if it is due; True when one left."""
        if time.monotonic() < self._retry_at.get(signal, 0.0):
            return False
        entry = self.spool.oldest(signal)
        if entry is None or entry.payload is None:
            return False
        sender = self._senders[signal]
        if self._unanswered.get(signal) == (entry.stamp, entry.size):
            # (at least once: the receiver may have it from the attempt before)
            self._resent[signal] += entry.items
            self._health[signal].resend(sender.timeout)
        self._sending = True
        try:
            return self._sent(signal, entry, sender.send(entry.payload))
        finally:
            self._sending = False

    def _sent(self, signal: str, entry: Entry, reply: Reply) -> bool:
        """Count what came of sending ``entry``; True when it left the spool."""
        health = self._health[signal]
        if reply.unanswered:
            self._unanswered[signal] = (entry.stamp, entry.size)
        else:  # (an answer came: a later attempt adds no copy of this one)
            self._unanswered.pop(signal, None)
        if reply.delivered:
            self.spool.done(entry)
            self.sent += 1
            self._attempts[signal] = 0
            self._retry_at.pop(signal, None)
            figures = self.spool.figures(signal)
            health.record(True, entry.items, dropped=self.spool.recovered(signal),
                          waiting=figures["held"] + figures["spooled"])
            return True
        if not reply.retryable:
            self.spool.done(entry)
            self.refused += 1
            health.refuse(entry.items, reply.reason)
            return True
        health.outage()
        attempts = self._attempts[signal] = self._attempts.get(signal, 0) + 1
        delay = (min(reply.retry_after, RETRY_HINT_MAX) if reply.retry_after is not None
                 else backoff(attempts))
        self._retry_at[signal] = time.monotonic() + delay
        return False


def resend(directory: str, environ: Mapping[str, str], timeout: float
           ) -> dict[str, tuple[str, SignalFigures]]:
    """Send what the spool ``directory`` holds (the folders of processes that
    ended) to the OTLP endpoints ``environ`` configures, for at most ``timeout``
    seconds; what was not acknowledged stays there. Per signal found: where it went,
    and what came of it."""
    from dask_otel_spans.sdk.otlpsend import request_sender

    spool = Spool(directory, max_memory=0, max_disk=2**62, adopted_level=logging.INFO)
    delivery = Delivery(spool)
    spool.open()
    healths = {}
    for signal in SIGNALS:
        if spool.waiting(signal):
            sender = request_sender(environ, signal)
            healths[signal] = ExportHealth(
                signal, sender.where,
                f"trying again for at most {timeout:g} s; what is not sent stays in "
                f"the spool {directory}")
            delivery.add_signal(signal, sender, healths[signal])
    delivery.start()
    delivery.drain(timeout)
    out = {signal: (health.where,
                    delivery.figures(signal, health.delivered, health.failed))
           for signal, health in healths.items()}
    delivery.close(0.0)
    return out
