"""The export pipeline: the ender and metrics threads over one pair of providers,
built, flushed and stopped together, in the scheduler process or in the export
process."""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from dask_otel_spans import names
from dask_otel_spans.config import PluginConfig
from dask_otel_spans.export.caps import SeriesCap, SpanNameCap
from dask_otel_spans.export.ender import SpanEnder
from dask_otel_spans.export.metrics import DaskInstruments, MetricsPump
from dask_otel_spans.export.otlpprofiles import ProfileSender
from dask_otel_spans.export.writers import span_writer
from dask_otel_spans.protocol.figures import ExportFigures
from dask_otel_spans.protocol.outcome import describe, settled
from dask_otel_spans.sdk.health import rate_limit_sdk_logs
from dask_otel_spans.sdk.otlpsend import request_sender
from dask_otel_spans.sdk.providers import (
    Providers,
    flush_provider,
)

logger = logging.getLogger(__name__)


def _profile_sender(environ: Mapping[str, str],
                    tracer_provider: object) -> ProfileSender | None:
    """``profile.otlp``'s sender, with the traces' resource; None (one ERROR line)
    when the profiles' endpoint cannot be used: the rest exports all the same."""
    try:
        sender = request_sender(environ, "profiles")
    except (ValueError, OSError) as e:
        logger.error("dask_otel_spans: profile.otlp: cannot send profiles (%s: %s); "
                     "they are not sent", type(e).__name__, e)
        return None
    resource = getattr(getattr(tracer_provider, "resource", None), "attributes", None)
    return ProfileSender(sender, dict(resource or {}))


@dataclass
class ExportPipeline:
    """The threads that turn span snapshots and heartbeat deltas into OTel data.

    Build it with :meth:`build`; its threads are running from then on.
    """

    providers: Providers
    ender: SpanEnder
    instruments: DaskInstruments | None = None
    pump: MetricsPump | None = None
    _undo_log_limit: Callable[[], None] | None = field(default=None, repr=False)
    #: sends the prefix profiles over OTLP (``profile.otlp``); None: not sent
    profile_sender: ProfileSender | None = None

    @classmethod
    def build(cls, providers: Providers, config: PluginConfig,
              environ: Mapping[str, str] | None = None) -> ExportPipeline:
        """Start the metrics thread (when there is a meter provider) and the
        ender thread over ``providers`` (and the profiles' sender with
        ``profile.otlp``, to the OTLP endpoint of ``environ``, else of
        ``os.environ``)."""
        instruments = pump = None
        if providers.meter_provider is not None:
            meter = providers.meter_provider.get_meter(names.INSTRUMENTATION_SCOPE, names.VERSION)
            instruments = DaskInstruments(
                meter,
                SpanNameCap(config.span_name_depth, config.max_span_names),
                SeriesCap(config.max_series),
                prefix_spans=config.prefix_spans,
            )
            pump = MetricsPump(instruments)
        tracer_provider = providers.tracer_provider
        profile_sender = None
        if config.profile_enabled and config.profile_otlp:
            profile_sender = _profile_sender(os.environ if environ is None else environ,
                                             tracer_provider)
        ender = SpanEnder(
            # the package's own providers: spans built directly; a user's: the API
            span_writer(tracer_provider, owned=tracer_provider in providers.built),
            pump,
            prefix_spans=config.prefix_spans,
            code_max_length=config.max_code_length if config.include_code else None,
            record_exceptions=config.record_exceptions,
            exception_events=providers.exceptions.events,
            # (the logger provider may be there for the live records alone)
            logger_provider=(providers.logger_provider if providers.exceptions.logs
                             else None),
            profiles_dir=providers.files_dir if config.profile_enabled else None,
            profile_sender=profile_sender,
        )
        # threads (and the SDK log filter) start once everything is built: a failure
        # above leaves nothing behind
        undo_log_limit = rate_limit_sdk_logs() if providers.owned else None
        if pump is not None:
            pump.start()
        ender.start()
        if profile_sender is not None:
            profile_sender.start()
        return cls(providers, ender, instruments, pump, undo_log_limit,
                   profile_sender=profile_sender)

    def flush(self, timeout: float) -> bool:
        """Wait until everything queued so far reached the providers, then flush
        them (a meter provider's push readers only: :func:`flush_provider`); False
        when something did not finish within ``timeout`` seconds, or when the last
        export of an exporter built here failed (a collector that is down)."""
        deadline = time.monotonic() + timeout
        ok = True
        # the ender feeds the pump: flush it first
        for worker in (self.ender, self.profile_sender, self.pump):
            if worker is not None:
                ok = worker.flush(max(0.0, deadline - time.monotonic())) and ok
        for provider in self.providers.all:
            if hasattr(provider, "force_flush"):
                left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
                try:
                    ok = flush_provider(provider, left_ms) and ok
                except Exception:
                    logger.exception("dask_otel_spans: flushing %r failed", provider)
                    ok = False
        delivery = self.providers.redelivery
        if delivery is not None:  # (what is held: sent; or not due before then, or
            # tried again and not taken: a backend that is down is not waited for)
            ok = delivery.drain(max(0.0, deadline - time.monotonic()),
                                until_refused=True) and ok
        return ok and self.providers.delivering()

    def stop_threads(self, timeout: float) -> None:
        """Handle what is queued, then end the ender and metrics threads."""
        self.ender.stop(timeout)
        if self.profile_sender is not None:
            self.profile_sender.stop(timeout)
        if self.pump is not None:
            self.pump.stop(timeout)

    def close_providers(self, timeout: float) -> None:
        """Shut down the providers the pipeline owns; flush the others."""
        providers = self.providers
        for provider in providers.all:
            try:
                if provider in providers.owned:
                    provider.shutdown()
                elif hasattr(provider, "force_flush"):
                    flush_provider(provider, int(timeout * 1000))
            except Exception:
                logger.exception("dask_otel_spans: flushing %r failed", provider)
        if self._undo_log_limit is not None:
            # kept until the providers' final flush is over
            self._undo_log_limit()
            self._undo_log_limit = None

    def shut_down(self, timeout: float) -> bool:
        """Stop the threads and close the providers, waiting at most ``timeout``
        seconds in all (a collector that is down makes exporters retry for longer;
        what they hold is tried until then and left in the spool); then say in one
        line what came of the export (:func:`~dask_otel_spans.protocol.outcome.describe`)
        when not everything was delivered. False when they did not finish in time."""
        deadline = time.monotonic() + timeout
        self.stop_threads(timeout)
        closing = threading.Thread(
            target=self.close_providers, args=(max(0.0, deadline - time.monotonic()),),
            name="dask-otel-spans-close-providers", daemon=True,
        )
        closing.start()
        closing.join(max(0.0, deadline - time.monotonic()))
        finished = not closing.is_alive()
        delivery = self.providers.redelivery
        if delivery is not None:
            delivery.close(max(0.0, deadline - time.monotonic()))
        self._say_outcome(timeout, finished)
        return finished

    def _say_outcome(self, timeout: float, finished: bool) -> None:
        """One line at close, from the exporters' figures (those ``ExportState``
        reads), unless everything was delivered."""
        providers = self.providers
        figures = providers.delivery()
        signals = [("traces", providers.traces_to, self.ender.otel_spans),
                   ("metrics", providers.metrics_to, None)]
        if figures["logs"].counted:
            signals.append(("logs", providers.logs_to, None))
        if finished and all(settled(figures[s]) for s, _, _ in signals):
            return
        # (what is held is said where; only what no one holds any more is lost)
        line = "; ".join(
            describe(figures[signal], signal, where, handed, providers.spool_directory,
                     at_close=True, timed_out=None if finished else timeout)
            for signal, where, handed in signals
        )
        if not finished:  # (why the close took that long)
            line += (f"; the exporters stopped at otel-spans.shutdown-timeout "
                     f"({timeout:.1f} s)")
        logger.warning("dask_otel_spans: at close, %s", line)

    def cpu_seconds(self) -> float:
        """CPU seconds of the pipeline's threads (ender and metrics) so far."""
        return self.ender.cpu_seconds + (
            self.pump.cpu_seconds if self.pump is not None else 0.0
        )

    def figures(self) -> ExportFigures:
        """The pipeline's part of the export session's figures."""
        instruments, pump, ender = self.instruments, self.pump, self.ender
        return ExportFigures(
            ended=ender.ended_count,
            ender_cpu_s=ender.cpu_seconds,
            metrics_cpu_s=pump.cpu_seconds if pump is not None else 0.0,
            queue_dropped=ender.dropped + (pump.dropped if pump is not None else 0),
            metric_updates=instruments.updates if instruments is not None else 0,
            metric_sdk_calls=instruments.sdk_calls if instruments is not None else 0,
            summaries=len(ender.summaries),
            signals=self.providers.delivery(),
            spool_directory=self.providers.spool_directory,
        )
