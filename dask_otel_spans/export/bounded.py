"""A bounded memory: an insertion-ordered dict that forgets its oldest entries past a
limit (ids seen, warnings said, traces of recent spans), so that what the export
session remembers stays bounded whatever runs for how long."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any


class BoundedMemory(OrderedDict):
    """An ``OrderedDict`` of at most ``limit`` entries; :meth:`remember` adds one
    (or refreshes it) and forgets the oldest past the limit."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = max(1, limit)

    def remember(self, key: Any, value: Any = None) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)
