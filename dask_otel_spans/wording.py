"""Counted nouns in what the package says: ``1 task``, ``2 tasks``; one rule for the
command line, the report and log lines."""
from __future__ import annotations


def counted(n: object, thing: str, things: str | None = None) -> str:
    """``n`` and ``thing``, plural unless ``n`` is 1.

    Parameters
    ----------
    n:
        The count (as a file has it: a number, or the string of one)
    thing:
        The noun, singular
    things:
        Its plural, when not ``thing`` + ``s``

    Examples
    --------
    >>> counted(1, "task"), counted(3, "task"), counted(1, "batch", "batches")
    ('1 task', '3 tasks', '1 batch')
    """
    one = n == 1 or n == "1"
    return f"{n} {thing if one else (things or thing + 's')}"
