"""Fixtures of the transport's tests: an export process and its sender."""
from __future__ import annotations

import pytest

from dask_otel_spans.config import PluginConfig
from dask_otel_spans.transport.hold import BusyLoopHold
from dask_otel_spans.transport.sender import ChildSender
from dask_otel_spans.transport.spec import PipelineSpec
from dask_otel_spans.transport.supervisor import ChildSupervisor


def start_sender(output_dir, hold: BusyLoopHold | None = None) -> ChildSender:
    """A started sender to an export process writing OTLP-JSON files to
    ``output_dir``."""
    supervisor = ChildSupervisor(
        PipelineSpec(PluginConfig.from_dask_config(output_dir=str(output_dir)),
                     environ={})
    )
    supervisor.launch()
    sender = ChildSender(supervisor, hold=hold)
    sender.start()
    return sender


@pytest.fixture
def file_export_process(tmp_path):
    """An export process writing OTLP-JSON files to ``tmp_path``, started."""
    sender = start_sender(tmp_path)
    yield sender
    sender.stop(10)
