"""Reading the ``otel-spans`` settings from every source (YAML, dask config,
``DASK_OTEL_SPANS__*``, the plugin's keyword arguments): values parsed in one place,
a value a setting cannot take one ERROR line and its default."""
from __future__ import annotations

import logging

import dask
import pytest

from dask_otel_spans.config import DEFAULTS, SETTINGS, PluginConfig


def test_export_process_defaults_to_auto():
    assert PluginConfig.from_dask_config().export_process == "auto"


def test_every_default_comes_from_the_shipped_yaml():
    """Each default is written once: the dataclass has none of its own, and every
    setting of the YAML has a field."""
    import dataclasses

    from dask_otel_spans.config import DEFAULTS

    fields = dataclasses.fields(PluginConfig)
    assert all(f.default is dataclasses.MISSING for f in fields)

    def keys(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict):
                # (metrics.* fields keep their leaf's name; live.*, spool.* and
                # profile.* fields are live_*, spool_* and profile_*)
                yield from keys(value, f"{key}_" if key in ("live", "spool", "profile")
                                else "")
            else:
                yield prefix + key.replace("-", "_")

    field_names = {f.name for f in fields}
    aliases = {"span_name_depth", "max_span_names", "max_series"}  # (under metrics)
    assert set(keys(DEFAULTS["otel-spans"])) == field_names
    assert aliases <= field_names


def test_an_unknown_setting_is_refused_by_name():
    with pytest.raises(TypeError, match="tick_budget"):
        PluginConfig.from_dask_config(tick_budget=0.5)


@pytest.mark.parametrize("given, closest", [("export_dely", "export_delay"),
                                             ("metrics_max_span_names", "max_span_names")])
def test_a_misspelt_keyword_setting_names_the_closest_one(given, closest):
    with pytest.raises(TypeError, match=f"did you mean {closest}\\?"):
        PluginConfig.from_dask_config(**{given: 5})


@pytest.mark.parametrize(
    "value, expected",
    [(True, True), (False, False), ("true", True), ("Yes", True), ("1", True),
     ("false", False), ("off", False), ("0", False), ("auto", "auto"),
     (" AUTO ", "auto")],
)
def test_export_process_reads_booleans_and_words(value, expected):
    with dask.config.set({"otel-spans.export-process": value}):
        setting = PluginConfig.from_dask_config().export_process
    assert setting == expected and type(setting) is type(expected)


def test_export_process_false_from_an_environment_variable_is_false():
    # dask keeps "false" a string (only Python literals are parsed): it must not be
    # taken as a true value
    from_env = dask.config.collect_env({"DASK_OTEL_SPANS__EXPORT_PROCESS": "false"})
    with dask.config.set(from_env):
        assert PluginConfig.from_dask_config().export_process is False


def test_export_process_given_to_the_plugin_is_read_the_same_way():
    assert PluginConfig.from_dask_config(export_process="off").export_process is False
    assert PluginConfig.from_dask_config(export_process=True).export_process is True


def _leaf_keys(node, prefix=""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaf_keys(value, f"{prefix}{key}.")
        else:
            yield prefix + key


#: Every key of the shipped YAML: the tests below are generated from it
YAML_KEYS = sorted(_leaf_keys(DEFAULTS["otel-spans"]))
#: A value of the wrong type, a negative one and nonsense (a NUL byte is no path,
#: no word, no number and no module either)
BAD_VALUES = [["wrong", "type"], -1, "bad\x00value"]


def test_every_key_of_the_yaml_has_one_setting():
    assert sorted(s.key for s in SETTINGS) == YAML_KEYS


def test_the_typed_keys_of_setting_name_every_setting_once_with_its_field_type():
    """The overloads of ``setting()`` group the keys by the type of their value: each
    group names the settings whose :class:`PluginConfig` field has that type."""
    import dataclasses
    import typing

    from dask_otel_spans import config

    groups = {
        "float": config._FloatKey, "bool": config._BoolKey, "int": config._IntKey,
        "int | None": config._OptionalIntKey, "str": config._StrKey,
        "str | None": config._OptionalStrKey,
        "ExportProcessSetting": typing.Literal["export-process"],
    }
    field_types = {f.name: f.type for f in dataclasses.fields(PluginConfig)}
    typed = {key: kind for kind, keys in groups.items() for key in typing.get_args(keys)}
    assert sum(len(typing.get_args(keys)) for keys in groups.values()) == len(typed)
    assert typed == {s.key: field_types[s.field] for s in SETTINGS}


def _field(key):
    [setting] = [s for s in SETTINGS if s.key == key]
    return setting.field


def _one_error_line(caplog, key, value):
    lines = [r for r in caplog.records if r.name.startswith("dask_otel_spans")
             and r.levelno >= logging.WARNING]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    [line] = lines
    assert line.levelno == logging.ERROR and line.exc_info is None
    message = line.getMessage()
    assert f"otel-spans.{key} cannot be {value!r}" in message
    assert "it accepts" in message and "using the default" in message
    return message


@pytest.mark.parametrize("value", BAD_VALUES, ids=["type", "negative", "nonsense"])
@pytest.mark.parametrize("key", YAML_KEYS)
def test_a_bad_value_from_dask_config_is_one_error_line_and_the_default(
    key, value, caplog
):
    default = getattr(PluginConfig.from_dask_config(), _field(key))
    with dask.config.set({f"otel-spans.{key}": value}):
        with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
            config = PluginConfig.from_dask_config()
    assert getattr(config, _field(key)) == default
    _one_error_line(caplog, key, value)


@pytest.mark.parametrize("value", BAD_VALUES, ids=["type", "negative", "nonsense"])
@pytest.mark.parametrize("key", YAML_KEYS)
def test_a_bad_value_given_to_the_plugin_is_one_error_line_and_the_default(
    key, value, caplog
):
    from dask_otel_spans import OTelSpansPlugin

    default = getattr(PluginConfig.from_dask_config(), _field(key))
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        plugin = OTelSpansPlugin(**{_field(key): value})
    assert getattr(plugin.config, _field(key)) == default
    _one_error_line(caplog, key, value)


@pytest.mark.parametrize(
    "variable, value, field, default",
    [("DASK_OTEL_SPANS__EXPORT_DELAY", "abc", "export_delay", 1.0),
     ("DASK_OTEL_SPANS__EXPORT_DELAY", "-1s", "export_delay", 1.0),
     ("DASK_OTEL_SPANS__MAX_TASK_SPANS", "ten", "max_task_spans", 10),
     ("DASK_OTEL_SPANS__PREFIX_SPANS", "maybe", "prefix_spans", True),
     ("DASK_OTEL_SPANS__METRICS__MAX_SERIES", "lots", "max_series", 2000)],
)
def test_a_bad_environment_variable_is_one_error_line_and_the_default(
    variable, value, field, default, caplog
):
    with dask.config.set(dask.config.collect_env({variable: value})):
        with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
            assert getattr(PluginConfig.from_dask_config(), field) == default
    assert value in caplog.text and "it accepts" in caplog.text


@pytest.mark.parametrize(
    "settings, field, expected",
    [({"export_delay": "5s"}, "export_delay", 5.0),
     ({"lazy_timeout": "10 minutes"}, "lazy_timeout", 600.0),
     ({"idle_timeout": 0}, "idle_timeout", 0.0),
     ({"max_task_spans": "3"}, "max_task_spans", 3),
     ({"prefix_spans": "off"}, "prefix_spans", False),
     ({"max_series": "null"}, "max_series", None),
     ({"span_name_depth": 2}, "span_name_depth", 2),
     ({"task_spans": " All "}, "task_spans", "all"),
     ({"providers": "mod.sub:factory"}, "providers", "mod.sub:factory")],
)
def test_the_plugin_reads_its_arguments_as_dask_config_values(settings, field, expected):
    from dask_otel_spans import OTelSpansPlugin

    value = getattr(OTelSpansPlugin(**settings).config, field)
    assert value == expected and type(value) is type(expected)


def test_a_boolean_false_from_an_environment_variable_is_false():
    from_env = dask.config.collect_env({"DASK_OTEL_SPANS__PREFIX_SPANS": "false",
                                        "DASK_OTEL_SPANS__INCLUDE_CODE": "yes"})
    with dask.config.set(from_env):
        config = PluginConfig.from_dask_config()
    assert config.prefix_spans is False and config.include_code is True


def test_a_misspelt_key_is_one_error_line_naming_it(caplog):
    with dask.config.set({"otel-spans.export-dely": "2s"}):
        with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
            assert PluginConfig.from_dask_config().export_delay == 1.0
    [line] = [r.getMessage() for r in caplog.records]
    assert "otel-spans.export-dely is not a setting" in line
    assert "export-delay" in line


def test_max_series_is_a_dask_setting():
    assert PluginConfig.from_dask_config().max_series == 2000
    with dask.config.set({"otel-spans.metrics.max-series": 50}):
        assert PluginConfig.from_dask_config().max_series == 50
    with dask.config.set({"otel-spans.metrics.max-series": None}):
        assert PluginConfig.from_dask_config().max_series is None


def test_export_process_cpu_policy_comes_from_dask_config():
    assert PluginConfig.from_dask_config().export_process_cpu_policy == "idle"
    with dask.config.set({"otel-spans.export-process-cpu-policy": "Batch"}):
        assert PluginConfig.from_dask_config().export_process_cpu_policy == "batch"


COUNT_SPELLINGS = ["1000", "1_000", "1e3", "1E3", " 1.0e3 "]


@pytest.mark.parametrize("spelling", COUNT_SPELLINGS)
def test_a_count_is_read_in_the_spellings_an_operator_writes(spelling, caplog):
    """From the environment (as dask parses it), from dask config or a YAML file (a
    string), and given to the plugin: the same count, and no line."""
    from dask_otel_spans import OTelSpansPlugin

    from_env = dask.config.collect_env({"DASK_OTEL_SPANS__METRICS__MAX_SERIES": spelling})
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        with dask.config.set(from_env):
            assert PluginConfig.from_dask_config().max_series == 1000
        with dask.config.set({"otel-spans.metrics.max-series": spelling}):
            assert PluginConfig.from_dask_config().max_series == 1000
        assert OTelSpansPlugin(max_series=spelling).config.max_series == 1000
    assert caplog.records == []


@pytest.mark.parametrize("spelling", ["1.5", "1e-3", "inf", "10k"])
def test_a_count_that_is_no_whole_number_is_one_error_line(spelling, caplog):
    from_env = dask.config.collect_env({"DASK_OTEL_SPANS__METRICS__MAX_SERIES": spelling})
    with dask.config.set(from_env):
        with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
            assert PluginConfig.from_dask_config().max_series == 2000
    [line] = [r for r in caplog.records]
    assert line.levelno == logging.ERROR and "it accepts" in line.getMessage()


def test_a_misspelt_key_names_the_closest_setting(caplog):
    with dask.config.set({"otel-spans.metrics.max-serie": 10, "otel-spans.xyzzy": 1}):
        with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
            PluginConfig.from_dask_config()
    lines = sorted(r.getMessage() for r in caplog.records)
    assert "did you mean otel-spans.metrics.max-series?" in lines[0]
    assert "otel-spans.xyzzy is not a setting" in lines[1]
    assert "did you mean" not in lines[1]


def test_profile_as_a_flag_says_profile_enabled():
    """``profile: true`` / ``profile: false`` stand for ``profile.enabled``, the
    other profile settings keep their defaults."""
    with dask.config.set({"otel-spans.profile": True}):
        config = PluginConfig.from_dask_config()
    assert config.profile_enabled and config.profile_min_seconds == 1.0
    with dask.config.set({"otel-spans.profile": "off"}):
        assert not PluginConfig.from_dask_config().profile_enabled
    with dask.config.set({"otel-spans.profile.enabled": True,
                          "otel-spans.profile.timeout": "2s"}):
        config = PluginConfig.from_dask_config()
    assert config.profile_enabled and config.profile_timeout == 2.0
