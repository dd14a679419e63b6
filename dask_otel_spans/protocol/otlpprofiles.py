"""Prefix profiles as an OTLP ``ExportProfilesServiceRequest`` (the profiles signal,
development status), encoded by hand: no protobuf package needed at run time, and
the layout of the Collector it goes to (:data:`SAMPLE_FIELDS`)."""
from __future__ import annotations

import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dask_otel_spans.protocol.profiles import Frame, Node, stacks

#: ``Sample``'s field numbers as OpenTelemetry Collector v0.140.0 (pdata v1.46.0)
#: decodes them: stack_index 1, values 2, attribute_indices 3, link_index 4,
#: timestamps_unix_nano 5. The ``opentelemetry-proto`` Python package (1.45.1)
#: numbers them attribute_indices 2, link_index 3, values 4: such a request is
#: refused by that Collector (``proto: wrong wireType = 2 for field LinkIndex``).
#: The rest of the layout (dictionary tables, stacks, links) is the same in both.
SAMPLE_FIELDS: Mapping[str, int] = {"stack_index": 1, "values": 2,
                                    "attribute_indices": 3, "link_index": 4}


@dataclass(frozen=True)
class LinkedProfile:
    """One prefix's call tree and the span it belongs to."""

    tree: Node
    trace_id: int
    span_id: int
    start_ns: int
    end_ns: int
    #: profile attributes (strings)
    attributes: Mapping[str, str]


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _tag(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, value: int) -> bytes:
    return _tag(field, 0) + _varint(value) if value else b""


def _fixed64(field: int, value: int) -> bytes:
    return _tag(field, 1) + struct.pack("<Q", value) if value else b""


def _bytes(field: int, value: bytes) -> bytes:
    return _tag(field, 2) + _varint(len(value)) + value


def _text(field: int, value: str) -> bytes:
    return _bytes(field, value.encode("utf-8")) if value else b""


def _packed(field: int, values: Sequence[int]) -> bytes:
    return _bytes(field, b"".join(_varint(v) for v in values)) if values else b""


def _any_value(value: object) -> bytes:
    """An ``AnyValue``: strings, bools, ints, floats, sequences of them."""
    if isinstance(value, bool):
        return _tag(2, 0) + _varint(int(value))
    if isinstance(value, int):
        return _tag(3, 0) + _varint(value)
    if isinstance(value, float):
        return _tag(4, 1) + struct.pack("<d", value)
    if isinstance(value, str):
        return _bytes(1, value.encode("utf-8"))
    if isinstance(value, Sequence):
        return _bytes(5, b"".join(_bytes(1, _any_value(v)) for v in value))
    return _bytes(1, str(value).encode("utf-8"))


def _key_values(field: int, attributes: Mapping[str, object]) -> bytes:
    return b"".join(_bytes(field, _text(1, key) + _bytes(2, _any_value(value)))
                    for key, value in attributes.items())


class _Dictionary:
    """The request's shared tables; entry 0 of each is the zero value."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {"": 0}
        #: a frame's index in both the location and the function table (one
        #: location per function: distributed's frames hold no line of their own)
        self.frames: dict[Frame, int] = {}
        self.stacks: dict[tuple[int, ...], int] = {}
        self.links: dict[tuple[int, int], int] = {}
        self.attributes: dict[tuple[str, str], int] = {}

    def string(self, text: str) -> int:
        return self.strings.setdefault(text, len(self.strings))

    def location(self, frame: Frame) -> int:
        index = self.frames.get(frame)
        if index is None:
            index = self.frames[frame] = len(self.frames) + 1
            for text in (frame.name, frame.file):
                self.string(text)
        return index

    def stack(self, frames: Sequence[Frame]) -> int:
        # (innermost first, as pprof and OTLP list a sample's locations)
        key = tuple(self.location(f) for f in reversed(frames))
        return self.stacks.setdefault(key, len(self.stacks) + 1)

    def link(self, trace_id: int, span_id: int) -> int:
        return self.links.setdefault((trace_id, span_id), len(self.links) + 1)

    def attribute(self, key: str, value: str) -> int:
        self.string(key)
        return self.attributes.setdefault((key, value), len(self.attributes) + 1)

    def encode(self) -> bytes:
        zero = _bytes(1, b"") + _bytes(2, b"") + _bytes(3, b"") + _bytes(4, b"")
        out = [zero]  # mapping, location, function and link tables' entry 0
        for frame, index in self.frames.items():
            line = _int(1, index) + _int(2, max(frame.line, 0))
            out.append(_bytes(2, _bytes(3, line)))
        for frame in self.frames:
            out.append(_bytes(3, _int(1, self.strings[frame.name])
                              + _int(3, self.strings[frame.file])
                              + _int(4, max(frame.line, 0))))
        for trace_id, span_id in self.links:
            out.append(_bytes(4, _bytes(1, trace_id.to_bytes(16, "big"))
                              + _bytes(2, span_id.to_bytes(8, "big"))))
        out.extend(_bytes(5, text.encode("utf-8")) for text in self.strings)
        out.append(_bytes(6, b""))
        for key, value in self.attributes:
            out.append(_bytes(6, _int(1, self.strings[key])
                              + _bytes(2, _any_value(value))))
        out.append(_bytes(7, b""))
        out.extend(_bytes(7, _packed(1, key)) for key in self.stacks)
        return b"".join(out)


def profiles_request(profiles: Sequence[LinkedProfile],
                     resource: Mapping[str, object], scope: tuple[str, str],
                     sample_fields: Mapping[str, int] = SAMPLE_FIELDS) -> bytes:
    """The encoded ``ExportProfilesServiceRequest`` of ``profiles``: one resource
    (``resource``'s attributes), one scope (name, version), one profile per
    :class:`LinkedProfile` whose every sample (a stack and its count of samples)
    links to its span. ``sample_fields`` are ``Sample``'s field numbers."""
    dictionary = _Dictionary()
    sample_type = _int(1, dictionary.string("samples")) + _int(2, dictionary.string("count"))
    encoded = []
    for profile in profiles:
        link = dictionary.link(profile.trace_id, profile.span_id)
        samples = []
        for frames, count in stacks(profile.tree):
            samples.append(_bytes(2, _int(sample_fields["stack_index"],
                                          dictionary.stack(frames))
                                  + _packed(sample_fields["values"], [count])
                                  + _int(sample_fields["link_index"], link)))
        attributes = [dictionary.attribute(k, v) for k, v in profile.attributes.items()]
        encoded.append(_bytes(2, b"".join((
            _bytes(1, sample_type), *samples,
            _fixed64(3, profile.start_ns),
            _int(4, max(profile.end_ns - profile.start_ns, 0)),
            _bytes(7, os.urandom(16)),
            _packed(11, attributes)))))
    scope_profiles = _bytes(1, _text(1, scope[0]) + _text(2, scope[1])) + b"".join(encoded)
    resource_profiles = (_bytes(1, _key_values(1, resource))
                         + _bytes(2, scope_profiles))
    return _bytes(1, resource_profiles) + _bytes(2, dictionary.encode())
