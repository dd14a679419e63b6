"""The task log handler on the root logger leaves a worker's stderr as it was."""
from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk._logs import LoggerProvider

from dask_otel_spans.worker.logs import task_log_handlers


@pytest.fixture
def alone_logger(request):
    """Makes a logger tree with no handlers and no way up to the root (where pytest
    puts its own): what a worker's root logger is without handlers; it gets the
    package's task log handlers as the worker plugin puts them on the root logger.
    (Made in the test: pytest also puts its handlers on the loggers that do not
    propagate when the test starts.)"""
    made = []

    def make() -> logging.Logger:
        top = logging.getLogger(f"tasks_{request.node.name}")
        top.propagate = False
        handlers = task_log_handlers(LoggerProvider(), logging.WARNING)
        for handler in handlers:
            top.addHandler(handler)
        made.append((top, handlers))
        return top

    yield make
    for top, handlers in made:
        for handler in handlers:
            top.removeHandler(handler)


def test_a_warning_no_other_handler_takes_still_reaches_stderr(alone_logger, capsys):
    top = alone_logger()
    logging.getLogger(f"{top.name}.mytask").warning("working on %s", 1)
    assert capsys.readouterr().err == "working on 1\n"


def test_a_warning_another_handler_takes_is_not_printed_again(alone_logger, capsys):
    top = alone_logger()
    seen = []
    other = logging.Handler()
    other.emit = seen.append  # type: ignore[method-assign]
    top.addHandler(other)
    try:
        logging.getLogger(f"{top.name}.mytask").warning("working")
    finally:
        top.removeHandler(other)
    assert len(seen) == 1
    assert capsys.readouterr().err == ""


def test_two_workers_in_one_process_print_a_warning_once(alone_logger, capsys):
    alone_logger()
    top = alone_logger()
    logging.getLogger(f"{top.name}.mytask").warning("once")
    assert capsys.readouterr().err == "once\n"


def test_info_records_stay_off_stderr_as_without_the_handlers(alone_logger, capsys):
    top = alone_logger()
    logging.getLogger(f"{top.name}.mytask").info("detail")
    assert capsys.readouterr().err == ""
