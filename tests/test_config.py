"""Reading the ``otel-spans`` settings: the ``export-process`` switch (true, false or
auto) from YAML booleans and from environment-variable words."""
from __future__ import annotations

import logging

import dask
import pytest

from dask_otel_spans.config import PluginConfig, parse_export_process


def test_export_process_defaults_to_auto():
    assert PluginConfig.from_dask_config().export_process == "auto"
    assert PluginConfig().export_process == "auto"


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
