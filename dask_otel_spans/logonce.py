"""Log each kind of problem once: bad input and failures are said, never repeated per
span or per message."""
from __future__ import annotations

import logging


class OnceLogger:
    """Log a message the first time its ``kind`` comes, and drop it after that.

    Parameters
    ----------
    logger:
        Where the lines go; each is prefixed ``dask_otel_spans: ``
    """

    def __init__(self, logger: logging.Logger):
        self.logger = logger
        self.kinds: set[str] = set()

    def __call__(self, kind: str, msg: str, *args: object, level: int = logging.WARNING,
                 exc_info: bool = False) -> None:
        if kind not in self.kinds:
            self.kinds.add(kind)
            self.logger.log(level, "dask_otel_spans: " + msg, *args, exc_info=exc_info)

    def failure(self, where: str) -> None:
        """The exception being handled, once per place, with its traceback."""
        self(f"error:{where}", "unexpected error in %s (logged once)", where,
             level=logging.ERROR, exc_info=True)
