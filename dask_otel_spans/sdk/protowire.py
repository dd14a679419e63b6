"""The protobuf wire format, written by hand: varints, fields, strings, and OTLP's
``AnyValue`` and ``KeyValue`` of plain values, as the SDK's encoders make them (the
OTLP encoders of :mod:`~dask_otel_spans.sdk.otlpspans` and
:mod:`~dask_otel_spans.sdk.otlpmetrics` build requests from these)."""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from struct import Struct
from typing import Any

fixed64 = Struct("<Q").pack
fixed32 = Struct("<I").pack
double = Struct("<d").pack
sfixed64 = Struct("<q").pack
#: the varint of each number below 128: one byte
ONE_BYTE = [bytes((i,)) for i in range(128)]
INT64_MIN, INT64_END = -(1 << 63), 1 << 63


def varint(n: int) -> bytes:
    """A non-negative number as a varint."""
    if n < 0x80:
        return ONE_BYTE[n]
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    n = len(payload)
    return tag + (ONE_BYTE[n] if n < 0x80 else varint(n)) + payload


def string(tag: bytes, value: str | None) -> bytes:
    """A string field, left out when empty (proto3)."""
    return field(tag, value.encode()) if value else b""


class Unusual(Exception):
    """A value of a class the hand-written encoding does not cover: the SDK's
    encoder is asked (SDK versions differ on such values)."""


def any_value(value: object) -> bytes:
    """An ``AnyValue`` of a plain value (``str``, ``int``, ``float``, ``bool``, or a
    tuple or list of them), as the SDK's encoder makes it; :class:`Unusual` for any
    other."""
    encode = _BY_CLASS.get(value.__class__)
    if encode is None:
        raise Unusual
    return encode(value)


def _int(value: int) -> bytes:
    if not INT64_MIN <= value < INT64_END:
        raise Unusual
    return b"\x18" + varint(value & 0xFFFFFFFFFFFFFFFF)


def _array(values: Sequence[object]) -> bytes:
    return field(b"\x2a", b"".join([field(b"\x0a", any_value(v)) for v in values]))


#: the encoding of a value of each plain class
_BY_CLASS: dict[type, Callable[[Any], bytes]] = {
    str: lambda value: field(b"\x0a", value.encode()),
    int: _int,
    float: lambda value: b"\x21" + double(value),
    bool: lambda value: b"\x10\x01" if value else b"\x10\x00",
    tuple: _array,
    list: _array,
}

@functools.lru_cache(maxsize=4096)
def key_field(key: str) -> bytes:
    """The ``key`` field of a ``KeyValue`` (remembered for the names seen lately: a
    few dozen in practice)."""
    return string(b"\x0a", key)


@functools.lru_cache(maxsize=4096)
def double_head(tag: bytes, key: str) -> bytes:
    """All of a ``KeyValue`` field (``tag``) of a ``double`` value but the value's
    eight bytes: its length is known from ``key`` alone."""
    key_part = key_field(key)
    return tag + varint(len(key_part) + 11) + key_part + b"\x12\x09\x21"


def key_values(tag: bytes, attributes: Mapping[str, object] | None,
               unusual: Callable[[str, object], bytes | None] | None = None
               ) -> list[bytes]:
    """One ``KeyValue`` field per attribute. A value that is not plain raises
    :class:`Unusual`, or, with ``unusual``, gets the ``KeyValue`` it returns for it
    (None: the attribute is left out)."""
    out: list[bytes] = []
    if not attributes:
        return out
    one_byte = ONE_BYTE
    for key, value in attributes.items():
        cls = value.__class__
        if cls is str:
            data = value.encode()  # type: ignore[attr-defined]
            n = len(data)
            encoded = b"\x0a" + (one_byte[n] if n < 0x80 else varint(n)) + data
        elif cls is float:  # (the most frequent: figures in seconds)
            out.append(double_head(tag, key) + double(value))
            continue
        elif cls is int and INT64_MIN <= value < INT64_END:  # type: ignore[operator]
            encoded = b"\x18" + varint(value & 0xFFFFFFFFFFFFFFFF)  # type: ignore[operator]
        else:
            try:
                encoded = any_value(value)
            except Unusual:
                if unusual is None:
                    raise
                pair = unusual(key, value)
                if pair is not None:
                    out.append(field(tag, pair))
                continue
        n = len(encoded)
        pair = key_field(key) + b"\x12" + (one_byte[n] if n < 0x80 else varint(n)) + encoded
        n = len(pair)
        out.append(tag + (one_byte[n] if n < 0x80 else varint(n)) + pair)
    return out
