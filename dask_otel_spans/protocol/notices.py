"""The client helper's close notice (``span()``'s block exited), read and checked:
pure, no state."""
from __future__ import annotations

from itertools import repeat
from typing import NamedTuple, TypedDict

from dask_otel_spans.protocol.propagation import carried_headers


class CloseNotice(TypedDict, total=False):
    """A close notice as the client helper logs it (``Client.log_event`` on
    :data:`~dask_otel_spans.names.EVENT_TOPIC`); the scheduler passes on whatever
    came, which :func:`read_notice` checks."""

    ids: list[str]
    name: list[str]
    opened: int
    #: ``{dask span id: W3C headers}``
    otel: dict[str, dict[str, str]]
    enter: float
    exit: float
    lazy: bool
    client: str


class CloseNoticeFields(NamedTuple):
    """What a close notice says."""

    #: chain of dask span ids, root first
    ids: tuple[str, ...]
    #: the tags of the innermost level
    tags: tuple[str, ...]
    #: how many levels (innermost first) the block opened
    opened: int
    #: client-side enter and exit times
    enter: float
    exit: float
    #: W3C headers carried per dask span id, as sent
    carried: dict[str, object]
    #: collections built in the block still hold its annotation
    lazy: bool
    client: str | None


def read_notice(msg: CloseNotice) -> CloseNoticeFields:
    """The fields of a close notice; raises ``ValueError`` or ``TypeError`` (saying
    why) for one that is not of the helper's shape."""
    try:
        ids = tuple(msg["ids"])
        tags = tuple(map(str, msg["name"]))
        opened = int(msg["opened"])
        enter = float(msg["enter"])
        exit_ = float(msg["exit"])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None
    if not ids or len(ids) != len(tags) or not 1 <= opened <= len(ids):
        raise ValueError("inconsistent ids/name/opened")
    if not all(map(isinstance, ids, repeat(str))):
        raise TypeError("span ids must be strings")
    client = msg.get("client")
    return CloseNoticeFields(
        ids, tags, opened, enter, exit_, carried_headers(msg.get("otel")) or {},
        msg.get("lazy") is True, client if isinstance(client, str) else None,
    )
