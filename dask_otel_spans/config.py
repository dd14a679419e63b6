"""Package settings: the ``otel-spans`` dask config namespace and its typed view."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, Union

import dask.config
import yaml
from dask.utils import parse_timedelta

from dask_otel_spans.task_sampling import TASK_SPAN_MODES

logger = logging.getLogger(__name__)

_DEFAULTS_FILE = os.path.join(os.path.dirname(__file__), "otel-spans.yaml")
NAMESPACE = "otel-spans"


def _load_defaults() -> dict[str, Any]:
    with open(_DEFAULTS_FILE) as f:
        defaults = yaml.safe_load(f)
    dask.config.update_defaults(defaults)
    return defaults


#: The shipped defaults, also the fallback when something reset dask's config
#: (e.g. a test harness that restores a snapshot taken before this import)
DEFAULTS: dict[str, Any] = _load_defaults()


def _shipped_default(key: str) -> Any:
    node: Any = DEFAULTS[NAMESPACE]
    for part in key.split("."):
        node = node[part]
    return node


#: ``export-process``: True, False, or ``"auto"`` (the export process wherever the
#: providers are built from configuration)
ExportProcessSetting = Union[bool, Literal["auto"]]
EXPORT_PROCESS_AUTO: Literal["auto"] = "auto"

#: ``export-process-cpu-policy``: how the export process's threads are scheduled
#: (Linux): ``idle`` (``SCHED_IDLE``: only on CPU time nothing else wants), ``batch``
#: (``SCHED_BATCH``: never preempts a running thread when it wakes), ``normal`` (as
#: the scheduler)
CPU_POLICIES = ("idle", "batch", "normal")
CPU_POLICY_DEFAULT = _shipped_default("export-process-cpu-policy")
TASK_SPANS_DEFAULT = _shipped_default("task-spans")

_TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
_FALSE_WORDS = frozenset({"false", "no", "off", "0"})


def parse_export_process(value: Any) -> ExportProcessSetting:
    """``export-process`` as True, False or ``"auto"``, from a boolean or the words
    an environment variable gives (``DASK_OTEL_SPANS__EXPORT_PROCESS=false``).

    Anything else is logged and taken as ``"auto"``.
    """
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word == EXPORT_PROCESS_AUTO:
        return EXPORT_PROCESS_AUTO
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    logger.warning(
        "dask_otel_spans: otel-spans.export-process must be true, false or auto, not "
        "%r; using auto", value,
    )
    return EXPORT_PROCESS_AUTO


def parse_cpu_policy(value: Any) -> str:
    """``export-process-cpu-policy`` as one of :data:`CPU_POLICIES`; anything else is
    logged and taken as the default."""
    word = str(value).strip().lower()
    if word in CPU_POLICIES:
        return word
    logger.warning(
        "dask_otel_spans: otel-spans.export-process-cpu-policy must be one of %s, not "
        "%r; using %s", ", ".join(CPU_POLICIES), value, CPU_POLICY_DEFAULT,
    )
    return CPU_POLICY_DEFAULT


def parse_task_spans(value: Any) -> str:
    """``task-spans`` as one of :data:`~dask_otel_spans.task_sampling.TASK_SPAN_MODES`;
    anything else is logged and taken as the default."""
    word = str(value).strip().lower()
    if word in TASK_SPAN_MODES:
        return word
    logger.warning(
        "dask_otel_spans: otel-spans.task-spans must be one of %s, not %r; using %s",
        ", ".join(TASK_SPAN_MODES), value, TASK_SPANS_DEFAULT,
    )
    return TASK_SPANS_DEFAULT


#: Seconds between two ticks: the scheduler forwards what changed, and the export
#: session looks at the spans that changed or whose wait ran out. A tick costs what
#: changed, so a short interval is cheap; it bounds how long a ready span waits.
TICK_INTERVAL = 0.1


@dataclass(frozen=True)
class PluginConfig:
    """Typed settings of :class:`~dask_otel_spans.OTelSpansPlugin`.

    Build it with :meth:`from_dask_config`; every field mirrors a key of the
    ``otel-spans`` namespace (durations in seconds), whose defaults are written
    once, in ``otel-spans.yaml``.
    """

    export_delay: float
    idle_timeout: float
    lazy_timeout: float
    prefix_spans: bool
    task_spans: str
    max_task_spans: int
    record_exceptions: bool
    include_code: bool
    max_code_length: int
    span_name_depth: int | None
    max_span_names: int
    max_series: int | None
    output_dir: str
    export_process: ExportProcessSetting
    export_process_cpu_policy: str
    forward_budget: int
    shutdown_timeout: float
    providers: str | None

    @classmethod
    def from_dask_config(cls, **overrides: Any) -> PluginConfig:
        """Read the ``otel-spans`` namespace; keyword arguments win over it."""

        def get(key: str) -> Any:
            return dask.config.get(f"{NAMESPACE}.{key}", default=_shipped_default(key))

        def seconds(key: str) -> float:
            return float(parse_timedelta(get(key), default="seconds"))

        known = {f.name for f in fields(cls)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"Unknown otel-spans settings: {sorted(unknown)}")
        depth = get("metrics.span-name-depth")
        series = get("metrics.max-series")
        factory = get("providers")
        cfg = cls(
            export_delay=seconds("export-delay"),
            idle_timeout=seconds("idle-timeout"),
            lazy_timeout=seconds("lazy-timeout"),
            prefix_spans=bool(get("prefix-spans")),
            task_spans=parse_task_spans(get("task-spans")),
            max_task_spans=max(0, int(get("max-task-spans"))),
            record_exceptions=bool(get("record-exceptions")),
            include_code=bool(get("include-code")),
            max_code_length=int(get("max-code-length")),
            span_name_depth=None if depth in (None, "", "null") else int(depth),
            max_span_names=int(get("metrics.max-span-names")),
            max_series=None if series in (None, "", "null") else int(series),
            output_dir=str(get("output-dir")),
            export_process=parse_export_process(get("export-process")),
            export_process_cpu_policy=parse_cpu_policy(
                get("export-process-cpu-policy")
            ),
            forward_budget=int(get("forward-budget")),
            shutdown_timeout=seconds("shutdown-timeout"),
            providers=str(factory) if factory not in (None, "", "null") else None,
        )
        if "export_process" in overrides:
            overrides = {
                **overrides,
                "export_process": parse_export_process(overrides["export_process"]),
            }
        if "task_spans" in overrides:
            overrides = {
                **overrides, "task_spans": parse_task_spans(overrides["task_spans"])
            }
        if "export_process_cpu_policy" in overrides:
            overrides = {
                **overrides,
                "export_process_cpu_policy": parse_cpu_policy(
                    overrides["export_process_cpu_policy"]
                ),
            }
        cfg = replace(cfg, **overrides) if overrides else cfg
        return cfg._without_negative_durations()

    def _without_negative_durations(self) -> PluginConfig:
        """The settings, a negative duration replaced by its default (said once)."""
        fixed = {}
        for key in DURATIONS:
            name = key.replace("-", "_")
            value = getattr(self, name)
            if value < 0:
                default = float(parse_timedelta(_shipped_default(key), default="seconds"))
                logger.error(
                    "dask_otel_spans: otel-spans.%s must not be negative, not %gs; "
                    "using the default, %gs", key, value, default,
                )
                fixed[name] = default
        return replace(self, **fixed) if fixed else self


#: The settings that are durations
DURATIONS = ("export-delay", "idle-timeout", "lazy-timeout", "shutdown-timeout")
