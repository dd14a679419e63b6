"""``dask-otel-spans resend DIR``: the batches a spool directory holds, each sent to
the destination it was held for, with the credentials of the environment only where
they are the ones it was held with (a digest tells); or, when asked, every batch to
the endpoints the environment configures."""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from dask_otel_spans.otelenv import ConfigurationError, signal_setting
from dask_otel_spans.protocol.figures import SIGNALS, SignalFigures
from dask_otel_spans.protocol.outcome import UNITS
from dask_otel_spans.sdk.delivery import Delivery
from dask_otel_spans.sdk.destination import (
    Destination,
    destination_of,
    userinfo,
    with_userinfo,
)
from dask_otel_spans.sdk.health import ExportHealth
from dask_otel_spans.sdk.spool import Spool
from dask_otel_spans.wording import counted

#: The option of ``resend`` that sends every batch to the environment's endpoints
ANY_DESTINATION = "--any-destination"


@dataclass(frozen=True)
class Resent:
    """What came of the batches sent to one destination."""

    signal: str
    #: where they went, in words (user info masked)
    where: str
    figures: SignalFigures


@dataclass
class Outcome:
    """What ``resend`` sent, per destination, and what it left in the spool, in
    words (why, and how to send it)."""

    resent: list[Resent] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def resend(directory: str, environ: Mapping[str, str], timeout: float,
           any_destination: bool = False) -> Outcome:
    """Send what the spool ``directory`` holds (the folders of processes that
    ended) for at most ``timeout`` seconds; what was not acknowledged stays there.

    Each batch goes to the destination it was held for (signal, protocol,
    endpoint), with the credentials (headers, endpoint user info) and TLS settings
    ``environ``'s ``OTEL_EXPORTER_OTLP_*`` variables give its signal, only when
    their digest is the one it was held with; the others stay, said in
    :attr:`Outcome.left`. With ``any_destination``, every batch goes to the
    endpoint ``environ`` configures for its signal, with its credentials.
    """
    destinations = {signal: destination_of(environ, signal) for signal in SIGNALS}
    spool = Spool(directory, max_memory=0, max_disk=2**62, adopted_level=logging.INFO)
    delivery = Delivery(spool)
    chooser = _Chooser(environ, destinations, delivery, any_destination,
                       f"trying again for at most {timeout:g} s; what is not sent "
                       f"stays in the spool {directory}")
    delivery.start(accept=chooser.accept)
    try:
        out = Outcome()
        if spool.directory is None:  # (it could not be trusted or opened: said)
            out.left.append(f"nothing sent: the spool {directory} was not opened (the "
                            "line above says why)")
            return out
        delivery.drain(timeout)
        for destination in delivery.destinations:
            health = chooser.health[destination.key]
            out.resent.append(Resent(destination.signal, health.where, delivery.figures(
                destination.signal, health.delivered, health.failed, destination.key)))
        for left in spool.left:
            unit = UNITS.get(left.signal, "item")
            what = (f"{counted(left.batches, 'batch', 'batches')} "
                    f"({counted(left.items, unit)}) of {left.signal}")
            why = chooser.why.get((left.signal, left.key),
                                  "not taken this time (a name already taken)")
            out.left.append(f"{what} {why}: left in the spool {directory}")
        return out
    finally:
        delivery.close(0.0)


class _Chooser:
    """Where the batches of each destination found in the spool go
    (:data:`~dask_otel_spans.sdk.spooltakeover.Accept`), and why those left are left."""

    def __init__(self, environ: Mapping[str, str], destinations: dict[str, Destination],
                 delivery: Delivery, any_destination: bool, holding: str):
        self.environ = environ
        self.destinations = destinations
        self.delivery = delivery
        self.any_destination = any_destination
        self.holding = holding
        self.health: dict[str, ExportHealth] = {}
        #: (signal, key) -> why its batches are left, in words
        self.why: dict[tuple[str, str | None], str] = {}

    def accept(self, signal: str, key: str | None,
               destination: Destination | None) -> Destination | None:
        if self.any_destination:
            return self._to(self.destinations[signal], self.environ)
        if destination is None:
            self.why[signal, key] = (
                "of an unknown destination (written before batches were bound to "
                "theirs, or its record is missing); " + ANY_DESTINATION
                + " sends them to this environment's endpoint")
            return None
        # (the environment's credentials for its signal, to where the batch goes: the
        # same destination only when they are the ones it was held with)
        upper = signal.upper()
        info = userinfo(signal_setting(self.environ, upper, "ENDPOINT") or "")
        environ = {**self.environ,
                   f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT":
                       with_userinfo(destination.endpoint, info),
                   f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL": destination.protocol}
        try:
            target = destination_of(environ, signal)
            if target.key == destination.key:
                return self._to(target, environ)
        except ConfigurationError as e:  # (a protocol or endpoint that cannot work)
            self.why[signal, key] = (
                f"held for OTLP {destination.protocol} {destination.shown}, which "
                f"cannot be sent to with this environment: {e}")
            return None
        self.why[signal, key] = (
            f"held for OTLP {destination.protocol} {destination.shown} with other "
            "credentials (OTEL_EXPORTER_OTLP_*HEADERS, the endpoint's user info) than "
            "this environment's: not sent there with these; run resend with the "
            f"credentials they were held with, or {ANY_DESTINATION} to send them to "
            "this environment's endpoint")
        return None

    def _to(self, target: Destination, environ: Mapping[str, str]) -> Destination:
        """``target``, its sender built (once) from ``environ``."""
        from dask_otel_spans.sdk.otlpsend import request_sender

        if target.key not in self.health:
            health = ExportHealth(target.signal,
                                  f"OTLP {target.protocol} to {target.shown}",
                                  self.holding)
            self.health[target.key] = health
            self.delivery.add_destination(target, request_sender(environ, target.signal),
                                          health)
        return target
