"""The client helper's close notice (``span()``'s block exited), read and checked (its
shape, and whether its times are possible): pure, no state."""
from __future__ import annotations

from itertools import repeat
from typing import NamedTuple, TypedDict

from dask_otel_spans.protocol.propagation import carried_headers

#: How far ahead of the scheduler's clock a client's may be (Kerberos' default maximum
#: clock skew): a block cannot have exited later than the scheduler got its notice, by
#: more than this
MAX_CLOCK_SKEW = 300.0
#: The longest a block is taken to have run (its times are used only for a span
#: without tasks): an enter earlier than the notice's arrival by more is taken for
#: another clock or unit (seconds since boot, milliseconds, 0)
MAX_BLOCK_SECONDS = 30 * 86_400.0


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
    #: client-side enter and exit times (the notice's arrival, when its times were
    #: not possible: ``times_ignored``)
    enter: float
    exit: float
    #: W3C headers carried per dask span id, as sent
    carried: dict[str, object]
    #: collections built in the block still hold its annotation
    lazy: bool
    client: str | None
    #: the notice's times were not possible (:func:`possible_times`), and are replaced
    times_ignored: bool = False


def possible_times(enter: float, exit_: float, received: float) -> bool:
    """Whether a block that ran from ``enter`` to ``exit_`` (the client's clock) could
    have been told to the scheduler at ``received`` (its clock): numbers in order, the
    exit no later than ``received`` (give or take :data:`MAX_CLOCK_SKEW`), the enter
    no earlier than :data:`MAX_BLOCK_SECONDS` before it. False for NaN and
    infinities."""
    return (received - MAX_BLOCK_SECONDS <= enter <= exit_
            <= received + MAX_CLOCK_SKEW)


def read_notice(msg: CloseNotice, received: float | None = None) -> CloseNoticeFields:
    """The fields of a close notice; raises ``ValueError`` or ``TypeError`` (saying
    why) for one that is not of the helper's shape. With ``received`` (when the
    scheduler got it, its clock), times that are not possible
    (:func:`possible_times`) are replaced by ``received`` (``times_ignored``)."""
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
    ignored = False
    if received is not None and not possible_times(enter, exit_, received):
        enter = exit_ = received
        ignored = True
    return CloseNoticeFields(
        ids, tags, opened, enter, exit_, carried_headers(msg.get("otel")) or {},
        msg.get("lazy") is True, client if isinstance(client, str) else None, ignored,
    )
