"""Reading the ``otel-spans`` settings: the ``export-process`` switch (true, false or
auto) from YAML booleans and from environment-variable words."""
from __future__ import annotations

import logging

import dask
import pytest

from dask_otel_spans.config import PluginConfig, parse_export_process


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
                yield from keys(value, "")
            else:
                yield key.replace("-", "_")

    field_names = {f.name for f in fields}
    aliases = {"span_name_depth", "max_span_names", "max_series"}  # (under metrics)
    assert set(keys(DEFAULTS["otel-spans"])) == field_names
    assert aliases <= field_names


def test_an_unknown_setting_is_refused_by_name():
    with pytest.raises(TypeError, match="tick_budget"):
        PluginConfig.from_dask_config(tick_budget=0.5)


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


def test_a_bad_export_process_value_is_logged_and_taken_as_auto(caplog):
    with caplog.at_level(logging.WARNING, logger="dask_otel_spans"):
        assert parse_export_process("sometimes") == "auto"
    [record] = [r for r in caplog.records if "export-process" in r.getMessage()]
    assert "'sometimes'" in record.getMessage()
    assert "true, false or auto" in record.getMessage()
