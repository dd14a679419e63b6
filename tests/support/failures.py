"""Task code that fails, importable by workers (its exception classes pickle by
reference, as a user's own module's do)."""
from __future__ import annotations

import json


class Outer:
    class BadRecord(Exception):
        """A user-defined exception class, nested (its qualified name has a dot)."""


def bad_record(x: int) -> int:
    raise Outer.BadRecord(f"record {x}")


def bad_json(x: int) -> int:
    return json.loads("{" * (x + 1))


def bad_value(x: int) -> int:
    raise ValueError(f"value {x}")


def mixed(x: int) -> int:
    """Two kinds of failure: ``KeyError`` for multiples of 3, else ``ValueError``."""
    if x % 3 == 0:
        raise KeyError(x)
    raise ValueError(x)
