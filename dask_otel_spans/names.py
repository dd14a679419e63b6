"""Every attribute, metric and wire name this package exports or reads, in one place.

These names are API (see docs/data-contract.md): dashboards, trace queries and tests depend on them.
"""
from __future__ import annotations

import importlib.metadata

# -- plugin, annotation and event channel ------------------------------------------
#: Name of the scheduler plugin in ``Scheduler.plugins``
PLUGIN_NAME = "otel-spans"
#: Name of the worker plugin in ``Worker.plugins``
WORKER_PLUGIN_NAME = "otel-spans-worker"
#: Graph annotation key that carries the client's W3C trace context, one entry per
#: dask span id of the chain: ``{"<dask span id>": {"traceparent": ..., ...}}``
ANNOTATION_KEY = "otel"
#: Graph annotation key that carries the submitting caller's context, as the
#: propagators of ``OTEL_PROPAGATORS`` inject it (``traceparent``, ``tracestate``,
#: ``baggage``...): on bare submissions (no dask span block open) of an instrumented
#: client, and on a ``span()`` block's tasks when the caller has baggage
CALLER_ANNOTATION_KEY = "otel-caller"
#: ``Client.log_event`` topic on which the client helper says that a block closed
EVENT_TOPIC = "otel-spans"
#: Scheduler metadata (``Scheduler.set_metadata`` keys) that a plugin, running or
#: idle, sets to the package's version: a client asks for it once, off its
#: submissions' path
PLUGIN_METADATA_KEYS = ("dask_otel_spans", "plugin")
#: Scheduler metadata that a plugin sets, with :data:`PLUGIN_METADATA_KEYS`, to
#: :data:`PLUGIN_RUNNING` or to :data:`PLUGIN_IDLE` (it could not set up its
#: exporters: loaded, exporting nothing); a plugin that sets it answers
#: :data:`STATE_HANDLER`
PLUGIN_STATE_METADATA_KEYS = ("dask_otel_spans", "state")
PLUGIN_RUNNING = "running"
PLUGIN_IDLE = "idle"
#: The scheduler handler (``Scheduler.handlers``) a plugin registers: a client's
#: ``client.scheduler.dask_otel_spans_state(flush=..., exporters=...)`` gets the
#: plugin's :class:`~dask_otel_spans.client.state.ExportState` as a dict of its fields
STATE_HANDLER = "dask_otel_spans_state"
#: Instrumentation scope of the tracer and meter
INSTRUMENTATION_SCOPE = "dask_otel_spans"
try:
    #: The package's version (written once, in pyproject.toml), the instrumentation
    #: scope's version
    VERSION = importlib.metadata.version(INSTRUMENTATION_SCOPE)
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - not installed
    VERSION = "0+unknown"
#: Name dask gives to spans of tasks that were not annotated with a span
DEFAULT_SPAN_TAG = "default"

# -- resource ----------------------------------------------------------------------
SERVICE_NAME = "service.name"
#: One per exporting process (a random UUID) unless the user set one
SERVICE_INSTANCE_ID = "service.instance.id"
DEFAULT_SERVICE_NAME = "dask-scheduler"
SCHEDULER_ADDRESS = "dask.scheduler.address"
DEFAULT_WORKER_SERVICE_NAME = "dask-worker"
#: resource attributes of a worker process (its worker's address and name)
WORKER_NAME = "dask.worker.name"

# -- span attributes ---------------------------------------------------------------
SPAN_NAME = "dask.span.name"
SPAN_ID = "dask.span.id"
SPAN_TASK_COUNT = "dask.span.task_count"
SPAN_ERRED_COUNT = "dask.span.erred_count"
SPAN_NBYTES_TOTAL = "dask.span.nbytes_total"
SPAN_TASK_DURATION = "dask.span.task_duration"
SPAN_ACTIVE_CPU_SECONDS = "dask.span.active_cpu_seconds"
SPAN_INCOMPLETE = "dask.span.incomplete"
#: Why the plugin considered the span closed: see ``CLOSE_REASONS``
SPAN_CLOSE_REASON = "dask.span.close_reason"
#: Source code snippets (opt-in)
SPAN_CODE = "dask.span.code"
#: Caller span contexts of bare submissions linked from the span and not kept, past
#: ``MAX_SPAN_LINKS``
SPAN_LINKS_DROPPED = "dask.span.links_dropped"
#: Links to callers' span contexts kept per dask span (the SDK's default link limit)
MAX_SPAN_LINKS = 128
#: Prefix of the fine performance metrics rolled up by activity:
#: ``dask.metrics.<activity>.<unit>``
METRICS_ATTRIBUTE_PREFIX = "dask.metrics."

CLOSE_REASON_CLIENT = "client"  # the client helper's block exited
CLOSE_REASON_IDLE = "idle"  # no client helper: done and idle for idle-timeout
CLOSE_REASON_CLIENT_GONE = "client-disconnected"  # helper block never closed
CLOSE_REASON_SHUTDOWN = "shutdown"  # scheduler closed while the span was open

# -- task prefix child span attributes ------------------------------------------------
TASK_PREFIX = "dask.task.prefix"
TASK_GROUP_COUNT = "dask.task_group.count"
TASK_GROUP_TASK_COUNT = "dask.task_group.task_count"
TASK_GROUP_NBYTES_TOTAL = "dask.task_group.nbytes_total"

# -- profiles (docs/data-contract.md, "Profiles") -----------------------------------------
#: On a prefix span: the samples of the prefix's tasks that the workers' statistical
#: profiler took over the span's interval (every ``distributed.worker.profile.interval``)
PROFILE_SAMPLES = "dask.profile.samples"
#: On a prefix span: the hottest functions by own time, ``function (file:line) NN%``
PROFILE_TOP = "dask.profile.top"
#: On a prefix span: other dask spans that ran the same prefix in the profile's
#: windows (their samples are in the profile too); absent when none
PROFILE_SHARED_SPANS = "dask.profile.shared_spans"
#: On a prefix span: why part of its interval has no profile (the workers' history no
#: longer held it, a fetch failed or timed out); absent when nothing is missing
PROFILE_MISSING = "dask.profile.missing"
#: Functions named in ``dask.profile.top``
PROFILE_TOP_FUNCTIONS = 5

# -- task span attributes and events (task-spans) --------------------------------------
TASK_KEY = "dask.task.key"
WORKER_ADDRESS = "dask.worker.address"
TASK_NBYTES = "dask.task.nbytes"
#: On a prefix span (or the dask span, without prefix spans): tasks that could have
#: had a task span and have none, past ``max-task-spans``
TASK_SPANS_LEFT_OUT = "dask.task_spans.left_out"
#: Attribute of a task span's action events (``transfer``, ``disk-read``...): seconds
TASK_ACTION_DURATION = "dask.task.action.duration"
#: OpenTelemetry's error type (semantic conventions, stable): on erred task spans,
#: and on prefix and dask spans that hold erred tasks (their most frequent type)
ERROR_TYPE = "error.type"
#: OpenTelemetry's code attribute (stable): the task's function, on task spans
CODE_FUNCTION_NAME = "code.function.name"
#: Types named in an erred span's status description, the most frequent first
MAX_ERROR_TYPES_DESCRIBED = 3
#: OpenTelemetry's exception event and attributes
EXCEPTION_EVENT = "exception"
EXCEPTION_TYPE = "exception.type"
EXCEPTION_MESSAGE = "exception.message"
EXCEPTION_STACKTRACE = "exception.stacktrace"

# -- metric attributes ---------------------------------------------------------------
CONTEXT = "dask.context"
ACTIVITY = "dask.activity"
UNIT = "dask.unit"
#: Value of ``dask.span.name`` past the cardinality cap
OTHER_SPAN_NAME = "__other__"
#: Separator of the tags in the ``dask.span.name`` metric attribute
SPAN_NAME_SEPARATOR = "/"

# -- instruments -----------------------------------------------------------------------
#: The fine metrics' instruments: ``<prefix><family>`` for each family of
#: :data:`UNIT_FAMILIES` (``time``, ``data``, ``count``) and ``custom``
SPAN_ACTIVITY_PREFIX = "dask.span.activity."
WORKER_ACTIVITY_PREFIX = "dask.worker.activity."
SPAN_ACTIVITY_TIME = SPAN_ACTIVITY_PREFIX + "time"
SPAN_ACTIVITY_DATA = SPAN_ACTIVITY_PREFIX + "data"
SPAN_ACTIVITY_COUNT = SPAN_ACTIVITY_PREFIX + "count"
SPAN_ACTIVITY_CUSTOM = SPAN_ACTIVITY_PREFIX + "custom"
WORKER_ACTIVITY_TIME = WORKER_ACTIVITY_PREFIX + "time"
WORKER_ACTIVITY_DATA = WORKER_ACTIVITY_PREFIX + "data"
WORKER_ACTIVITY_COUNT = WORKER_ACTIVITY_PREFIX + "count"
WORKER_ACTIVITY_CUSTOM = WORKER_ACTIVITY_PREFIX + "custom"
SPAN_DURATION = "dask.span.duration"
SPAN_ACTIVE = "dask.span.active"

#: dask unit -> (instrument name suffix, OTel unit). Anything else is "custom", "1".
UNIT_FAMILIES: dict[str, tuple[str, str]] = {
    "seconds": ("time", "s"),
    "bytes": ("data", "By"),
    "count": ("count", "{event}"),
}
CUSTOM_UNIT_FAMILY = ("custom", "1")

# -- dask heartbeat keys ---------------------------------------------------------------
#: Contexts whose heartbeat keys carry a span id (``distributed.spans``)
CONTEXTS_WITH_SPAN_ID = ("execute", "p2p")
#: The synthetic key that ``Span.cumulative_worker_metrics`` adds
IDLE_PREFIX = "N/A"
IDLE_ACTIVITY = "idle or other spans"

# -- while a span runs (docs/data-contract.md, "While a span runs") ---------------------------
#: Event name of the log record made when the export side first learns of a dask span
SPAN_STARTED_EVENT = "dask.span.started"
#: Event name of the log record made every ``live.interval`` for a span open longer than
#: ``live.after``
SPAN_PROGRESS_EVENT = "dask.span.progress"
#: ``running`` on a pending span (``live.pending-spans``), and on the running spans that
#: ``tree`` and the report show from the records
SPAN_STATE = "dask.span.state"
SPAN_STATE_RUNNING = "running"
#: The parent's dask span id (none for a root) and the OTel span id (hex) of the
#: span's parent as it will be exported (a client's span, or the parent dask span's)
SPAN_PARENT_ID = "dask.span.parent_id"
SPAN_PARENT_SPAN_ID = "dask.span.parent_span_id"
#: Seconds since the span was enqueued on the scheduler
SPAN_ELAPSED = "dask.span.elapsed"
#: Tasks of the span's tree: settled without erring (finished, released or
#: forgotten), and seen erring
SPAN_TASKS_DONE = "dask.span.tasks.done"
SPAN_TASKS_ERRED = "dask.span.tasks.erred"
#: Tasks of the span's tree in the task groups submitted so far (done + erred +
#: running + waiting), running (``processing``), and waiting to run (``waiting``,
#: ``queued``, ``no-worker``)
SPAN_TASKS_TOTAL = "dask.span.tasks.total"
SPAN_TASKS_RUNNING = "dask.span.tasks.running"
SPAN_TASKS_WAITING = "dask.span.tasks.waiting"
#: Task groups of the span's tree with a task not settled (running or waiting), and
#: settled
SPAN_GROUPS_RUNNING = "dask.span.task_groups.running"
SPAN_GROUPS_DONE = "dask.span.task_groups.done"
#: Activity so far, from the heartbeats: seconds (every ``seconds`` activity) and bytes
SPAN_ACTIVITY_SECONDS = "dask.span.activity_seconds"
SPAN_ACTIVITY_BYTES = "dask.span.activity_bytes"
#: On a progress record: spans due a progress record this interval that got none
#: (past the bound, the most recent ones)
LIVE_SPANS_NOT_REPORTED = "dask.live.spans_not_reported"
#: Up-down counter: tasks of the open spans by state (``dask.task.state``), per
#: ``dask.span.name``; back to 0 when a span ends
SPAN_TASKS = "dask.span.tasks"
TASK_STATE = "dask.task.state"
TASK_STATE_DONE = "done"
TASK_STATE_ERRED = "erred"
TASK_STATE_RUNNING = "running"
TASK_STATE_WAITING = "waiting"
