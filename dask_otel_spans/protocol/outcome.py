"""What came of the export of one signal, in words, from the figures
:class:`~dask_otel_spans.state.ExportState` reads too: delivered, failed, still held
(in memory, in the spool directory), dropped past the spool's bounds, not attempted.
Every line that reports an outcome (the close line, the demo) says it this way."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: signal -> what its items are called
UNITS = {"traces": "spans", "metrics": "metric points", "logs": "log records"}


def _n(figures: Mapping[str, Any], key: str) -> int:
    value = figures.get(key)
    return int(value) if value is not None else 0


def waiting(figures: Mapping[str, Any], signal: str) -> int:
    """Items of ``signal`` still held (in memory and in the spool directory)."""
    return _n(figures, f"{signal}_held") + _n(figures, f"{signal}_spooled")


def describe(figures: Mapping[str, Any], signal: str, where: str,
             handed: int | None = None) -> str:
    """``"<signal> to <where>: N <unit> delivered, F failed[, H held in memory][,
    S in the spool DIR (...)][, D dropped ...][, U not attempted ...]"``.

    Parameters
    ----------
    figures:
        ``<signal>_delivered``, ``_failed``, ``_held``, ``_spooled``, ``_dropped``
        and ``spool_directory``, as the exporters' figures hold them; a None
        delivered means the exporters were not built here
    signal:
        ``traces``, ``metrics`` or ``logs``
    where:
        Where the signal goes, in words
    handed:
        Items handed to the SDK, when known: those no exporter reported on are
        "not attempted"
    """
    unit = UNITS.get(signal, "items")
    if figures.get(f"{signal}_delivered") is None:
        return f"{signal} to {where}: (its exporters are not the package's: no figures)"
    delivered, failed = _n(figures, f"{signal}_delivered"), _n(figures, f"{signal}_failed")
    held, spooled = _n(figures, f"{signal}_held"), _n(figures, f"{signal}_spooled")
    dropped = _n(figures, f"{signal}_dropped")
    parts = [f"{delivered} {unit} delivered", f"{failed} failed"]
    if held:
        parts.append(f"{held} still held in memory")
    if spooled:
        directory = figures.get("spool_directory")
        parts.append(
            f"{spooled} still held in the spool {directory} (the next export process "
            f"with that directory sends them first; or: dask-otel-spans resend "
            f"{directory})")
    if dropped:
        parts.append(f"{dropped} dropped past the spool's bounds "
                     "(otel-spans.spool.max-memory, max-disk)")
    if handed is not None:
        unreported = handed - delivered - failed - held - spooled - dropped
        if unreported > 0:
            parts.append(f"{unreported} not attempted (still in the SDK's queue)")
    return f"{signal} to {where}: " + ", ".join(parts)
