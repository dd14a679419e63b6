"""A bounded memory: an insertion-ordered dict that forgets its oldest entries past a
limit (ids seen, warnings said, traces of recent spans), so that what the export
session remembers stays bounded whatever runs for how long."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import TypeVar, overload

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class BoundedMemory(OrderedDict[K, V]):
    """An ``OrderedDict`` of at most ``limit`` entries; :meth:`remember` adds one
    (or refreshes it) and forgets the oldest past the limit. Of ``None`` values, it
    is a bounded set of keys."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = max(1, limit)

    @overload
    def remember(self: BoundedMemory[K, None], key: K) -> None: ...

    @overload
    def remember(self, key: K, value: V) -> None: ...

    def remember(self: BoundedMemory[K, V | None], key: K, value: V | None = None) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            self.popitem(last=False)
