"""Package settings: the ``otel-spans`` dask config namespace and its typed view."""
from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias, TypeVar, cast, overload

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

from dask_otel_spans.protocol.tasks import TASK_SPAN_MODES

logger = logging.getLogger(__name__)

#: A value of dask's config as YAML, JSON or the environment spell it
ConfigValue: TypeAlias = (
    "str | int | float | bool | None | list[ConfigValue] | dict[str, ConfigValue]"
)
#: A setting's value once parsed (:attr:`Setting.parse`)
SettingValue: TypeAlias = "bool | int | float | str | None"
_T = TypeVar("_T")

_DEFAULTS_FILE = os.path.join(os.path.dirname(__file__), "otel-spans.yaml")
NAMESPACE = "otel-spans"


def _load_defaults() -> dict[str, ConfigValue]:
    with open(_DEFAULTS_FILE) as f:
        defaults = yaml.safe_load(f)
    dask.config.update_defaults(defaults)
    return defaults


#: The shipped defaults, also the fallback when something reset dask's config
#: (e.g. a test harness that restores a snapshot taken before this import)
DEFAULTS: dict[str, ConfigValue] = _load_defaults()


#: ``export-process``: True, False, or ``"auto"`` (the export process wherever the
#: providers are built from configuration)
ExportProcessSetting = bool | Literal["auto"]
EXPORT_PROCESS_AUTO: Literal["auto"] = "auto"

#: ``export-process-cpu-policy``: how the export process's threads are scheduled
#: (Linux): ``idle`` (``SCHED_IDLE``: only on CPU time nothing else wants), ``batch``
#: (``SCHED_BATCH``: never preempts a running thread when it wakes), ``normal`` (as
#: the scheduler)
CPU_POLICIES = ("idle", "batch", "normal")

_TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
_FALSE_WORDS = frozenset({"false", "no", "off", "0"})
_NULL_WORDS = frozenset({"", "null", "none"})


class SettingError(ValueError):
    """A value a setting cannot take (the message says what it accepts)."""


def _word(value: object) -> str:
    if not isinstance(value, (str, bool, int)):
        raise SettingError(type(value).__name__)
    return str(value).strip().lower()


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    word = _word(value)
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return False
    raise SettingError(word)


def _choice(*options: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        word = _word(value)
        if word not in options:
            raise SettingError(word)
        return word

    return parse


def _export_process(value: object) -> ExportProcessSetting:
    if not isinstance(value, bool) and _word(value) == EXPORT_PROCESS_AUTO:
        return EXPORT_PROCESS_AUTO
    return _flag(value)


def _duration(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise SettingError(type(value).__name__)
    try:
        seconds = float(parse_timedelta(value, default="seconds"))
    except (KeyError, ValueError, TypeError, AttributeError):
        raise SettingError(value) from None
    if not seconds >= 0:  # (negative or NaN)
        raise SettingError(value)
    return seconds


def _interval(value: object) -> float:
    seconds = _duration(value)
    if not seconds > 0:
        raise SettingError(value)
    return seconds


def _whole_number(value: object) -> int:
    """``value`` as a whole number, in the spellings an operator writes for a count:
    ``1000``, ``"1000"``, ``"1_000"``, ``"1e3"`` (and ``1000.0``, which is what
    dask's config makes of ``DASK_...=1e3``)."""
    if isinstance(value, bool):
        raise SettingError(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise SettingError(value) from None
    if isinstance(value, float):
        if not value.is_integer():  # (a fraction, inf or NaN)
            raise SettingError(value)
        value = int(value)
    if not isinstance(value, int):
        raise SettingError(value)
    return value


def _count(minimum: int) -> Callable[[object], int]:
    def parse(value: object) -> int:
        count = _whole_number(value)
        if count < minimum:
            raise SettingError(value)
        return count

    return parse


def _optional(parse: Callable[[object], _T]) -> Callable[[object], _T | None]:
    def parse_or_null(value: object) -> _T | None:
        if value is None or (isinstance(value, str) and value.strip().lower() in _NULL_WORDS):
            return None
        return parse(value)

    return parse_or_null


def _directory(value: object) -> str:
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise SettingError(value)
    return value


def _bytes(value: object) -> int:
    if isinstance(value, bool):
        raise SettingError(value)
    try:
        n = parse_bytes(value) if isinstance(value, str) else value
    except (ValueError, TypeError):
        raise SettingError(value) from None
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or n < 0:
        raise SettingError(value)
    return n


def _spool_directory(value: object) -> str | None:
    """A directory, ``auto`` (kept as the word: the spool resolves it), or off
    (None: false, no, off, empty, null)."""
    if value is None or value is False:
        return None
    if isinstance(value, str) and value.strip().lower() in _FALSE_WORDS | _NULL_WORDS:
        return None
    return _directory(value)


_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _factory(value: object) -> str:
    if not isinstance(value, str) or not _FACTORY.match(value.strip()):
        raise SettingError(value)
    return value.strip()


@dataclass(frozen=True)
class Setting:
    """One key of the ``otel-spans`` namespace: how its values are read.

    Parameters
    ----------
    key:
        The key below ``otel-spans`` (``"export-delay"``, ``"metrics.max-series"``)
    field:
        The :class:`PluginConfig` field (and the plugin's keyword argument)
    parse:
        Turns a value from any source into the field's value; raises
        :class:`SettingError` for a value the setting cannot take
    accepts:
        What it accepts, in words (for the error line)
    """

    key: str
    field: str
    parse: Callable[[object], SettingValue]
    accepts: str

    @property
    def shipped(self) -> ConfigValue:
        """The default as ``otel-spans.yaml`` writes it."""
        node = DEFAULTS[NAMESPACE]
        for part in self.key.split("."):
            node = cast("dict[str, ConfigValue]", node)[part]
        return node

    @property
    def default(self) -> SettingValue:
        """The shipped default, parsed."""
        return self.parse(self.shipped)

    def read(self, value: object) -> SettingValue:
        """``value`` parsed; a value the setting cannot take is one ERROR line
        (the setting, the value, what it accepts, the default) and the default."""
        try:
            return self.parse(value)
        except SettingError:
            shipped = self.shipped
            logger.error(
                "dask_otel_spans: otel-spans.%s cannot be %r: it accepts %s; using the "
                "default, %s", self.key, value, self.accepts,
                "null" if shipped is None else shipped,
            )
            return self.default


_DURATION = "a non-negative duration (seconds, or e.g. '500ms', '5s', '10 minutes')"

#: Every setting of the ``otel-spans`` namespace, the only place values are parsed
SETTINGS: tuple[Setting, ...] = (
    Setting("export-delay", "export_delay", _duration, _DURATION),
    Setting("idle-timeout", "idle_timeout", _duration, _DURATION),
    Setting("lazy-timeout", "lazy_timeout", _duration, _DURATION),
    Setting("prefix-spans", "prefix_spans", _flag, "true or false"),
    Setting("task-spans", "task_spans", _choice(*TASK_SPAN_MODES),
            "one of " + ", ".join(TASK_SPAN_MODES)),
    Setting("max-task-spans", "max_task_spans", _count(0), "a whole number, 0 or more"),
    Setting("record-exceptions", "record_exceptions", _flag, "true or false"),
    Setting("include-code", "include_code", _flag, "true or false"),
    Setting("max-code-length", "max_code_length", _count(0),
            "a whole number of characters, 0 or more"),
    Setting("metrics.span-name-depth", "span_name_depth", _optional(_count(1)),
            "null (all tags) or a whole number, 1 or more"),
    Setting("metrics.max-span-names", "max_span_names", _count(0),
            "a whole number, 0 or more"),
    Setting("metrics.max-series", "max_series", _optional(_count(1)),
            "null (no cap) or a whole number, 1 or more"),
    Setting("output-dir", "output_dir", _directory, "a directory path"),
    Setting("export-process", "export_process", _export_process,
            "true, false or auto"),
    Setting("export-process-cpu-policy", "export_process_cpu_policy",
            _choice(*CPU_POLICIES), "one of " + ", ".join(CPU_POLICIES)),
    Setting("forward-budget", "forward_budget", _count(1),
            "a whole number of messages, 1 or more"),
    Setting("shutdown-timeout", "shutdown_timeout", _duration, _DURATION),
    Setting("providers", "providers", _optional(_factory),
            "null or 'package.module:callable'"),
    Setting("live.after", "live_after", _duration, _DURATION),
    Setting("live.interval", "live_interval", _interval,
            "a positive duration (seconds, or e.g. '500ms', '30s')"),
    Setting("live.pending-spans", "live_pending_spans", _flag, "true or false"),
    Setting("spool.max-memory", "spool_max_memory", _bytes,
            "a number of bytes, 0 or more (e.g. 64 MiB)"),
    Setting("spool.directory", "spool_directory", _spool_directory,
            "a directory path, auto (the user's cache directory) or false (memory only)"),
    Setting("spool.max-disk", "spool_max_disk", _bytes,
            "a number of bytes, 0 or more (e.g. 1 GiB)"),
    Setting("profile.enabled", "profile_enabled", _flag, "true or false"),
    Setting("profile.min-seconds", "profile_min_seconds", _duration, _DURATION),
    Setting("profile.max-fetches", "profile_max_fetches", _count(1),
            "a whole number, 1 or more"),
    Setting("profile.timeout", "profile_timeout", _interval,
            "a positive duration (seconds, or e.g. '500ms', '10s')"),
    Setting("profile.max-stacks", "profile_max_stacks", _count(1),
            "a whole number, 1 or more"),
    Setting("profile.window", "profile_window", _interval,
            "a positive duration (seconds, or e.g. '30s', '5 minutes')"),
    Setting("profile.otlp", "profile_otlp", _flag, "true or false"),
)
_BY_KEY = {s.key: s for s in SETTINGS}
_BY_FIELD = {s.field: s for s in SETTINGS}


#: The keys of :data:`SETTINGS` by the type of their parsed value (the overloads of
#: :func:`setting`)
_FloatKey: TypeAlias = Literal["export-delay", "idle-timeout", "lazy-timeout",
                               "shutdown-timeout", "live.after", "live.interval",
                               "profile.min-seconds", "profile.timeout",
                               "profile.window"]
_BoolKey: TypeAlias = Literal["prefix-spans", "record-exceptions", "include-code",
                              "live.pending-spans", "profile.enabled", "profile.otlp"]
_IntKey: TypeAlias = Literal["max-task-spans", "max-code-length",
                             "metrics.max-span-names", "forward-budget",
                             "spool.max-memory", "spool.max-disk",
                             "profile.max-fetches", "profile.max-stacks"]
_OptionalIntKey: TypeAlias = Literal["metrics.span-name-depth", "metrics.max-series"]
_StrKey: TypeAlias = Literal["task-spans", "output-dir", "export-process-cpu-policy"]
_OptionalStrKey: TypeAlias = Literal["providers", "spool.directory"]


@overload
def setting(key: _FloatKey) -> float: ...
@overload
def setting(key: _BoolKey) -> bool: ...
@overload
def setting(key: _IntKey) -> int: ...
@overload
def setting(key: _OptionalIntKey) -> int | None: ...
@overload
def setting(key: _StrKey) -> str: ...
@overload
def setting(key: _OptionalStrKey) -> str | None: ...
@overload
def setting(key: Literal["export-process"]) -> ExportProcessSetting: ...
@overload
def setting(key: str) -> SettingValue: ...
def setting(key: str) -> SettingValue:
    """The value of ``otel-spans.<key>`` in the current dask config, parsed (a value
    it cannot take: one ERROR line, and the default)."""
    spec = _BY_KEY[key]
    parent, _, leaf = key.rpartition(".")
    if leaf == "enabled":
        # (``profile: false`` says ``profile.enabled: false``)
        node = dask.config.get(f"{NAMESPACE}.{parent}", default=None)
        if node is not None and not isinstance(node, Mapping):
            return spec.read(node)
    return spec.read(dask.config.get(f"{NAMESPACE}.{key}", default=spec.default))


def user_set(key: str) -> bool:
    """Whether ``otel-spans.<key>`` was set by the user rather than left at its shipped
    default: in this process's dask config with another value, or in a dask config
    file or a ``DASK_*`` environment variable at all (read again: dask's config has
    merged those with the defaults, so one that names the default is told only
    there)."""
    spec = _BY_KEY[key]
    name = f"{NAMESPACE}.{key}"
    if dask.config.get(name, default=spec.shipped) != spec.shipped:
        return True
    return dask.config.get(name, default=None,
                           config=dask.config.collect(dask.config.paths)) is not None


def _unknown_keys(node: object, known: ConfigValue, prefix: str = "") -> list[str]:
    """Keys of the dask config namespace ``node`` that are not settings."""
    if not isinstance(node, Mapping):
        return []
    out = []
    for key, value in node.items():
        name = str(key).replace("_", "-")
        if not isinstance(known, Mapping) or name not in known:
            out.append(prefix + name)
        elif isinstance(known[name], Mapping):
            out.extend(_unknown_keys(value, known[name], f"{prefix}{name}."))
    return out


def _did_you_mean(key: str) -> str:
    """``"; did you mean otel-spans.<closest setting>?"``, or nothing when no
    setting's name is close to ``key``."""
    close = difflib.get_close_matches(key, _BY_KEY, n=1, cutoff=0.6)
    return f"; did you mean otel-spans.{close[0]}?" if close else ""


def _did_you_mean_field(name: str) -> str:
    """``" (did you mean <closest field>?)"`` for a keyword setting that is not one,
    or nothing when no field's name is close to ``name``."""
    close = difflib.get_close_matches(name, _BY_FIELD, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


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
    live_after: float
    live_interval: float
    live_pending_spans: bool
    spool_max_memory: int
    spool_directory: str | None
    spool_max_disk: int
    profile_enabled: bool
    profile_min_seconds: float
    profile_max_fetches: int
    profile_timeout: float
    profile_max_stacks: int
    profile_window: float
    profile_otlp: bool

    @classmethod
    def from_dask_config(cls, **overrides: object) -> PluginConfig:
        """Read the ``otel-spans`` namespace; keyword arguments (by field name) win
        over it. Every value, from either, goes through its :class:`Setting`: one it
        cannot take is one ERROR line and the default. A key of the namespace that is
        not a setting is one ERROR line too (a misspelt key would do nothing)."""
        unknown = set(overrides) - set(_BY_FIELD)
        if unknown:
            raise TypeError(
                "Unknown otel-spans settings: " + ", ".join(
                    repr(name) + _did_you_mean_field(name) for name in sorted(unknown))
                + f" (the keyword settings: {', '.join(_BY_FIELD)})")
        for key in _unknown_keys(dask.config.get(NAMESPACE, default={}),
                                 DEFAULTS[NAMESPACE]):
            logger.error("dask_otel_spans: otel-spans.%s is not a setting; ignored%s "
                         "(the settings: %s)", key, _did_you_mean(key),
                         ", ".join(_BY_KEY))
        # (each value as its Setting parsed it: the field's type)
        build = cast("Callable[..., PluginConfig]", cls)
        return build(**{
            s.field: s.read(overrides[s.field]) if s.field in overrides
            else setting(s.key)
            for s in SETTINGS
        })


