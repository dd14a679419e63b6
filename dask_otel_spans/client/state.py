"""What the scheduler's plugin tells a client: where data goes and how far export got
(:class:`ExportState`), read with ``client.run_on_scheduler``
(:func:`scheduler_state`), and :func:`wait_for_export`, which asks the plugin's
scheduler handler (:data:`~dask_otel_spans.names.STATE_HANDLER`: no log line on the
scheduler per poll). A client loads nothing of the scheduler, transport or export
sides for it, nor the OTel SDK."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dask_otel_spans import names
from dask_otel_spans.client.plugin_check import PLUGIN_FIX, plugin_metadata, status_of
from dask_otel_spans.protocol.figures import SIGNALS, ExportFigures, SignalFigures
from dask_otel_spans.wording import counted

if TYPE_CHECKING:
    from distributed import Client, Scheduler

#: ``traces_to`` and ``metrics_to`` of a plugin that could not set up its exporters
IDLE = "nowhere (the plugin is idle: its ERROR line in the scheduler's log says why)"


@dataclass(frozen=True)
class ExportState:
    """Where the scheduler's plugin sends data and how far export got, as the
    exporters reported it. The same fields in every state.

    Attributes
    ----------
    traces_to, metrics_to:
        Where traces and metrics go, in words (:data:`IDLE` when the plugin could
        not set up its exporters)
    export_process:
        Whether an export child process exports (else a thread of the scheduler)
    open:
        Dask spans not handed over yet (running, waiting for their block to close,
        or in their grace period); for the client that asks, not those that wait
        for another client alone (that client's close notices opened them and no
        task of them came: they wait for its graph, or their idle or lazy timeout)
    handed_over:
        Dask spans handed to the exporters (translated into OTel spans)
    traces_delivered, traces_failed:
        OTel spans the trace exporters reported delivered, and failed to deliver;
        None where the plugin did not build the exporters (given or global
        providers). With several exporters: the fewest delivered, the most failed.
    metrics_delivered, metrics_failed:
        Metric points the same way; None also for a pull reader (Prometheus: it is
        scraped, nothing is delivered)
    flushed:
        Whether the last flush finished in time, the last export of every
        exporter succeeded and nothing is held; None when no flush was asked for
    held, spooled, dropped:
        Per signal (``traces``, ``metrics``, ``logs``) whose OTLP exporter holds
        what it could not deliver: items waiting in memory, waiting in the spool
        directory, and dropped past the spool's bounds (``otel-spans.spool.*``)
    resent:
        Per signal whose OTLP exporter holds: items sent again because an attempt
        got no answer within the exporter's timeout (or lost its connection after
        the request went out): the backend may have received them twice (delivery
        is at least once; see the data contract's "Delivery")
    spool:
        The spool directory (None: held batches stay in memory, or nothing holds)
    """

    traces_to: str
    metrics_to: str
    export_process: bool
    open: int
    handed_over: int
    traces_delivered: int | None
    traces_failed: int | None
    metrics_delivered: int | None
    metrics_failed: int | None
    flushed: bool | None
    held: dict[str, int] = field(default_factory=dict)
    spooled: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    spool: str | None = None
    resent: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_figures(cls, figures: ExportFigures, destinations: Mapping[str, object],
                     *, open: int, handed_over: int, flushed: bool | None) -> ExportState:
        """The state from the export session's figures and where data goes
        (``traces_to``, ``metrics_to``, ``export_process``)."""
        traces, metrics = figures.signal("traces"), figures.signal("metrics")
        holding = {name: sig for name, sig in figures.signals.items()
                   if sig.held is not None}
        return cls(
            traces_to=str(destinations.get("traces_to", IDLE)),
            metrics_to=str(destinations.get("metrics_to", IDLE)),
            export_process=bool(destinations.get("export_process", False)),
            open=open, handed_over=handed_over,
            traces_delivered=traces.delivered, traces_failed=traces.failed,
            metrics_delivered=metrics.delivered, metrics_failed=metrics.failed,
            flushed=flushed,
            held={name: sig.held or 0 for name, sig in holding.items()},
            spooled={name: sig.spooled or 0 for name, sig in holding.items()},
            dropped={name: sig.dropped or 0 for name, sig in holding.items()},
            spool=figures.spool_directory,
            resent={name: sig.resent or 0 for name, sig in holding.items()},
        )

    def signal(self, name: str) -> SignalFigures:
        """What came of signal ``name`` (``traces``, ``metrics``, ``logs``)."""
        return SignalFigures(
            delivered=getattr(self, f"{name}_delivered", None),
            failed=getattr(self, f"{name}_failed", None),
            held=self.held.get(name), spooled=self.spooled.get(name),
            dropped=self.dropped.get(name), resent=self.resent.get(name))

    def outcome(self, signal: str | None = None) -> str:
        """What came of the export, in words: one line per signal the state has
        figures for (traces, metrics, and logs where their exporter holds), or of
        ``signal``'s only: delivered, failed, still held, dropped
        (:func:`~dask_otel_spans.protocol.outcome.describe`), and for traces the
        dask spans still open. An idle plugin: that it is idle, and where to look.

        Raises
        ------
        ValueError
            When ``signal`` is not one of ``traces``, ``metrics``, ``logs``.
        """
        if signal is not None and signal not in SIGNALS:
            raise ValueError(
                f"no signal {signal!r}: the signals are {', '.join(SIGNALS)}")
        if self.traces_to == IDLE and self.metrics_to == IDLE:
            return f"{signal or 'traces and metrics'} to {IDLE}"
        if signal is None:
            said = ["traces", "metrics"]
            if "logs" in {*self.held, *self.spooled, *self.dropped}:
                said.append("logs")
            return "\n".join(self.outcome(name) for name in said)
        if signal == "logs":
            return self._logs_outcome()
        from dask_otel_spans.protocol.outcome import describe

        where = self.traces_to if signal == "traces" else self.metrics_to
        text = describe(self.signal(signal), signal, where, spool_directory=self.spool)
        if signal == "traces" and self.open:
            text += (f", {counted(self.open, 'dask span')} still open (handed over "
                     f"when {'it ends' if self.open == 1 else 'they end'})")
        return text

    def _logs_outcome(self) -> str:
        """Logs: the state has what their exporter holds only (not what it delivered)."""
        from dask_otel_spans.protocol.outcome import waiting

        held = waiting(self.signal("logs"), self.spool)
        return (f"logs: {', '.join(held) or 'nothing held'} (the state counts what "
                "the log exporter holds, not what it delivered)")

    def to_message(self) -> dict[str, Any]:
        """The fields as plain data (what :data:`~dask_otel_spans.names.STATE_HANDLER`
        sends)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message: Mapping[str, Any]) -> ExportState:
        """The state :meth:`to_message` gave (fields it does not know ignored)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in message.items() if k in known})


async def scheduler_state(dask_scheduler: Scheduler, flush: bool = False,
                          exporters: bool = True,
                          client: str | None = None) -> ExportState | None:
    """The scheduler's plugin's :class:`ExportState`, for a client:
    ``client.run_on_scheduler(scheduler_state)`` (``flush=True`` forwards what
    happened so far and lets the export session hand over what is ready, and with
    ``exporters`` flushes the exporters, first; ``client``, the asking client's id:
    spans that wait for other clients alone are not open for it). None without the
    plugin."""
    plugin = dask_scheduler.plugins.get(names.PLUGIN_NAME)
    export_state = getattr(plugin, "export_state", None)
    if export_state is None:  # (no plugin, or not the package's)
        return None
    state: ExportState = await export_state(
        flush=flush, exporters=exporters,
        **({"client": client} if client is not None else {}))
    return state


class PluginMissing(RuntimeError):
    """The scheduler has no ``OTelSpansPlugin``."""


def _missing(address: str) -> PluginMissing:
    """:class:`PluginMissing` naming the scheduler and how to give it the plugin."""
    return PluginMissing(
        f"the scheduler at {address} has no dask_otel_spans plugin: {PLUGIN_FIX}")


#: Seconds between two questions of :func:`wait_for_export` while spans are open
POLL_INTERVAL = 0.1


def wait_for_export(client: Client, timeout: float = 30.0) -> ExportState:
    """Wait until the scheduler's plugin handed over every span (none open), then
    flush its exporters; where data went and how far export got.

    Spans are exported once done, closed and past a short grace period: call this
    before closing a short-lived cluster to see them exported as finished, not as
    incomplete at shutdown. Gives up after ``timeout`` seconds, returning the state
    then (``open`` tells what is left; ``outcome()`` says it).

    With an asynchronous client (``Client(asynchronous=True)``), ``await`` it.

    Returns
    -------
    :class:`ExportState`: ``flushed`` is False when the
    exporters did not finish or their last export failed (a collector that is
    down: ``held`` and ``spooled`` count what waits to be sent again).

    Raises
    ------
    PluginMissing
        When the scheduler has no plugin (started without ``--preload
        dask_otel_spans``).
    """
    # (with an asynchronous client, ``client.sync`` returns the coroutine to await)
    return client.sync(_wait_for_export, client, timeout)


async def _wait_for_export(client: Client, timeout: float) -> ExportState:
    deadline = time.monotonic() + timeout
    ask = await _state_asker(client)
    # (each call forwards what happened so far and reads fresh figures: an export
    # process reports its own twice a second otherwise; the exporters are flushed
    # once, at the end: a flush is an export, and a Collector's Prometheus exporter
    # keeps the exemplars of a series' latest export only)
    # (``client``: the spans that wait for other clients alone are not waited for)
    state = await ask(flush=True, exporters=False, client=client.id)
    while state.open and time.monotonic() < deadline:
        await asyncio.sleep(POLL_INTERVAL)
        state = await ask(flush=True, exporters=False, client=client.id)
    return await ask(flush=True, exporters=True, client=client.id)


async def _state_asker(client: Client) -> Callable[..., Awaitable[ExportState]]:
    """How to ask ``client``'s scheduler for the plugin's state: its handler, or
    ``run_on_scheduler`` for a plugin of a version without one.

    Raises
    ------
    PluginMissing
        When the scheduler has no plugin (its metadata: nothing run on it).
    """
    scheduler = client.scheduler
    if scheduler is None:
        raise AttributeError("the client is closed: it has no scheduler")
    address = str(scheduler.address)
    metadata = await plugin_metadata(client)
    if status_of(metadata) == "absent":
        raise _missing(address)
    if metadata.get(names.PLUGIN_STATE_METADATA_KEYS[-1]) is None:
        async def ask(**kwargs: object) -> ExportState:
            # (distributed's coroutine behind ``Client.run_on_scheduler``: this runs
            # on the client's loop; a plugin of a version without the handler takes
            # no ``client``)
            kwargs.pop("client", None)
            return _present(await client._run_on_scheduler(scheduler_state, **kwargs),
                            address)
        return ask
    handler = getattr(scheduler, names.STATE_HANDLER)

    async def ask_handler(**kwargs: object) -> ExportState:
        reply = await handler(**kwargs)
        if isinstance(reply, dict) and "error" in reply:
            raise RuntimeError(f"the dask_otel_spans plugin of the scheduler at "
                               f"{address} could not say its state: {reply['error']}")
        return _present(None if reply is None else ExportState.from_message(reply),
                        address)
    return ask_handler


def _present(state: ExportState | None, address: str) -> ExportState:
    """``state``; :class:`PluginMissing` when None (the plugin went away)."""
    if state is None:
        raise _missing(address)
    return state
