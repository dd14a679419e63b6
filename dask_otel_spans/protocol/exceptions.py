"""Names of an erred task's exception class as OpenTelemetry's conventions write them
(``exception.type``, ``error.type``): module and qualified name, bare for builtins, as
the SDK's ``Span.record_exception`` does. The scheduler notes what names the class
(O(1): the class itself when the exception object is at hand, else the first bytes of
its pickle, never unpickled); the export session works the name out of that."""
from __future__ import annotations

import pickletools
from collections.abc import Iterator

#: Bytes of an exception's pickle kept to find its class in (a pickle names the class
#: of the object it rebuilds first; module and qualified name take well under this)
PICKLE_HEAD = 512
#: The ``error.type`` of erred work whose exception class is not known (the
#: conventions' fallback value)
OTHER = "_OTHER"


def qualified_name(cls: type) -> str:
    """``module.Qualname`` of a class, the qualified name alone for builtins."""
    module = getattr(cls, "__module__", None)
    qualname = getattr(cls, "__qualname__", None) or getattr(cls, "__name__", "")
    return f"{module}.{qualname}" if module and module != "builtins" else str(qualname)


def exception_class(exception: object) -> str | bytes | None:
    """What names the class of an erred task's exception, as the scheduler's
    ``transition`` hook gets it (``exception``): the qualified name when the object is
    at hand (a worker in the scheduler's process passes it wrapped, ``Serialize``),
    else the first :data:`PICKLE_HEAD` bytes of its pickle (``Serialized`` frames, as
    workers send it); None when neither is there. O(1), never unpickles."""
    data = getattr(exception, "data", exception)
    if isinstance(data, BaseException):
        return qualified_name(type(data))
    # (a worker sends the exception's pickle, as bytes that distributed frames as
    # they are: serializer "dask" of type bytes, or "pickle")
    header = getattr(exception, "header", None)
    frames = getattr(exception, "frames", None)
    if not frames or (isinstance(header, dict)
                      and any(header.get("compression") or ())):
        return None
    try:
        return bytes(memoryview(frames[0])[:PICKLE_HEAD])
    except (TypeError, ValueError):
        return None


#: Modules whose functions rebuild an object of a class named after them in the
#: pickle (tblib's exception reducer, which distributed installs; copyreg's); a class
#: cloudpickle builds by value is not named at all
_REBUILDERS = ("tblib", "copyreg", "copy_reg", "cloudpickle")


def _pickle_globals(head: bytes) -> Iterator[tuple[str, str] | None]:
    """``(module, qualname)`` of each global a pickle names, in order; None for one
    whose name cannot be read."""
    strings: list[str] = []
    for opcode, arg, _ in pickletools.genops(head):
        name = opcode.name
        if name == "GLOBAL":  # protocols 0-3: "module name"
            module, _, qualname = str(arg).partition(" ")
            yield module, qualname
        elif name == "STACK_GLOBAL":  # protocols 4-5: the two strings before it
            yield (strings[-2], strings[-1]) if len(strings) >= 2 else None
        elif isinstance(arg, str):
            strings.append(arg)


def class_in_pickle(head: bytes) -> str | None:
    """The qualified name of the class a pickle rebuilds first (after the rebuilding
    functions of :data:`_REBUILDERS`), read from its opcodes without unpickling (a
    cut-off pickle is fine: the class comes first); None when it names none by
    reference (e.g. cloudpickle built the class by value) or is not a pickle."""
    try:
        for found in _pickle_globals(head):
            if found is None:
                return None
            module, qualname = found
            if module.split(".", 1)[0] in _REBUILDERS:
                if module.startswith("cloudpickle"):
                    return None
                continue
            if not qualname:
                return None
            return f"{module}.{qualname}" if module and module != "builtins" \
                else qualname
    except Exception:  # (cut off, or not a pickle)
        return None
    return None


def exception_type(bare: str, origin: str | bytes | None) -> str:
    """``exception.type`` of an erred task: ``origin``'s qualified name (see
    :func:`exception_class`) when it names the class ``bare`` (the type's name, as
    the exception's ``repr`` gives it; ``Exception`` when that could not be read)
    does, else ``bare``."""
    if isinstance(origin, bytes):
        origin = class_in_pickle(origin)
    if isinstance(origin, str) and origin and (
            bare in ("", "Exception")
            or origin.rpartition(".")[2] == bare.rpartition(".")[2]):
        return origin
    return bare or "Exception"
