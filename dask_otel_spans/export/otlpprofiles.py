"""``profile.otlp``: each dask span's prefix profiles sent as an OTLP profiles request
(development status) to the OTLP endpoint, on a thread of their own, each profile
linked to its prefix span."""
from __future__ import annotations

import logging
from collections.abc import Mapping

from dask_otel_spans import names
from dask_otel_spans.background import QueueThread, ThreadWorker
from dask_otel_spans.export.profiles import PrefixProfile
from dask_otel_spans.export.traces import SpanFields
from dask_otel_spans.logonce import OnceLogger
from dask_otel_spans.protocol.otlpprofiles import LinkedProfile, profiles_request
from dask_otel_spans.sdk.otlpsend import RequestSender

logger = logging.getLogger(__name__)

#: requests waiting to be sent; more are dropped (counted, logged once)
MAX_QUEUED = 64


def linked_profiles(fields: SpanFields,
                    profiles: Mapping[str, PrefixProfile]) -> list[LinkedProfile]:
    """The profiles of a dask span's prefixes that have samples, each linked to its
    prefix span."""
    out = []
    for prefix in fields.prefixes:
        key = str(prefix.attributes.get(names.TASK_PREFIX, prefix.name))
        profile = profiles.get(key)
        if profile is not None and profile.tree.total:
            out.append(LinkedProfile(
                profile.tree, fields.ids.trace_id, prefix.span_id, prefix.start_ns,
                prefix.end_ns, {names.TASK_PREFIX: key}))
    return out


class ProfileSender(ThreadWorker):
    """Encode and send the prefix profiles of each dask span handed to :meth:`send`.

    Parameters
    ----------
    sender:
        Where requests go (:func:`~dask_otel_spans.sdk.otlpsend.request_sender` of
        ``profiles``)
    resource:
        The traces' resource attributes
    """

    def __init__(self, sender: RequestSender, resource: Mapping[str, object]):
        self.sender = sender
        self.resource = dict(resource)
        self.thread = QueueThread("dask-otel-spans-profiles", self._send,
                                  maxsize=MAX_QUEUED, what="profile requests",
                                  counted_in="ProfileSender.dropped")
        self._log_once = OnceLogger(logger)
        #: requests the receiver took
        self.delivered = 0
        #: requests it did not take (or that did not reach it)
        self.failed = 0

    def send(self, fields: SpanFields, profiles: Mapping[str, PrefixProfile]) -> None:
        """Queue a dask span's profiles (none: nothing); encoded and sent on the
        sender's thread (a request of ``profile.max-stacks`` stacks takes tens of
        milliseconds to encode: not on the ender's)."""
        linked = linked_profiles(fields, profiles)
        if linked:
            self.thread.put(linked)

    def _send(self, linked: list[LinkedProfile]) -> None:
        payload = profiles_request(linked, self.resource,
                                   (names.INSTRUMENTATION_SCOPE, names.VERSION))
        reply = self.sender.send(payload)
        if reply.delivered:
            self.delivered += 1
            return
        self.failed += 1
        self._log_once("refused", "dask_otel_spans: profiles not delivered to %s (%s); "
                       "dropped (logged once)", self.sender.where, reply.reason)

    def stop(self, timeout: float = 10) -> None:
        super().stop(timeout)
        self.sender.close()
