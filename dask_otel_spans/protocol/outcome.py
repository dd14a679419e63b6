"""What came of the export of one signal, in words, from the figures
:class:`~dask_otel_spans.client.state.ExportState` reads too: delivered, failed, still held
(in memory, in the spool directory), dropped past the spool's bounds, not attempted.
Every line that reports an outcome (the close line, the demo) says it this way."""
from __future__ import annotations

from dask_otel_spans.protocol.figures import SignalFigures
from dask_otel_spans.wording import counted

#: signal -> what one of its items is called
UNITS = {"traces": "span", "metrics": "metric point", "logs": "log record"}


def describe(figures: SignalFigures, signal: str, where: str,
             handed: int | None = None, spool_directory: str | None = None,
             resending: bool = False, at_close: bool = False,
             timed_out: float | None = None) -> str:
    """``"<signal> to <where>: N <unit> delivered, F failed[, H held in memory][,
    S in the spool DIR (...)][, D dropped ...][, R sent again ...][, U not attempted
    ...]"``; at close, what no one holds any more is said lost, and only that.

    Parameters
    ----------
    figures:
        What the exporters of ``signal`` counted; a None ``delivered`` means they
        were not built here
    signal:
        ``traces``, ``metrics`` or ``logs``
    where:
        Where the signal goes, in words
    handed:
        Items handed to the SDK, when known: those no exporter reported on are
        "not attempted"
    spool_directory:
        Where the spooled items are
    resending:
        Said by ``dask-otel-spans resend``: spooled items are not told how to send
        them (the way being sent)
    at_close:
        Said as the exporters stopped: what is still held in memory, and what no
        exporter reported on, is lost with them (what the spool directory holds is
        not: it is said held there)
    timed_out:
        At close, the seconds (``otel-spans.shutdown-timeout``) the exporters did
        not finish within; None when they finished
    """
    unit = UNITS.get(signal, "item")
    if figures.delivered is None:
        if where.startswith("nowhere"):  # (e.g. OTEL_TRACES_EXPORTER=none)
            return f"{signal} to {where}"
        return (f"{signal} to {where} (not counted: pulled by a reader such as "
                "Prometheus, or sent by exporters the package did not build)")
    delivered, failed = figures.delivered, figures.failed or 0
    parts = [f"{counted(delivered, unit)} delivered", f"{failed} failed",
             *waiting(figures, spool_directory, resending, at_close)]
    if figures.resent:
        parts.append(f"{figures.resent} sent again after an attempt got no answer "
                     "in time (the backend may have them twice)")
    within = ("" if timed_out is None else
              f" within the {timed_out:.1f} s of otel-spans.shutdown-timeout")
    if handed is not None:
        unreported = (handed - delivered - failed - figures.waiting
                      - (figures.dropped or 0))
        if unreported > 0 and at_close:
            parts.append(f"{unreported} lost (not exported{within})")
        elif unreported > 0:
            parts.append(f"{unreported} not attempted (still in the SDK's queue)")
    elif timed_out is not None:  # (what its exporters had not reported on: uncounted)
        parts.append(f"what its exporters had not exported{within} is lost")
    return f"{signal} to {where}: " + ", ".join(parts)


def waiting(figures: SignalFigures, spool_directory: str | None = None,
            resending: bool = False, at_close: bool = False) -> list[str]:
    """What of a signal is still held (in memory, in the spool ``spool_directory``)
    or was dropped past the spool's bounds, in words; empty when nothing
    (``resending``, ``at_close``: as :func:`describe` says it)."""
    held, spooled = figures.held or 0, figures.spooled or 0
    dropped = figures.dropped or 0
    parts = []
    if held and at_close:  # (the spool wrote what it held to its directory, if any)
        parts.append(f"{held} lost (held in memory only)")
    elif held:
        parts.append(f"{held} still held in memory")
    if spooled:
        parts.append(f"{spooled} still held in the spool {spool_directory}" + (
            "" if resending else " (the next export process with that directory and "
            "destination sends them first; or: dask-otel-spans resend "
            f"{spool_directory})"))
    if dropped:
        parts.append(f"{dropped} dropped past the spool's bounds "
                     "(otel-spans.spool.max-memory, max-disk)")
    return parts


def settled(figures: SignalFigures) -> bool:
    """Whether nothing of the signal is held, failed or dropped."""
    return not (figures.waiting or figures.failed or figures.dropped)
