"""Dask's statistical profiles, read: a worker's profile tree (``distributed.profile``)
-> a call tree with each function's own samples, the hottest functions
(``dask.profile.top``), and a speedscope file. Pure: no I/O, no dask state.

How distributed counts (``distributed/profile.py``): a worker records each sample with
``process(frame, True, state)``, so a node's ``count`` is the samples in which it
called a deeper Python frame; the samples in which a frame was the innermost show only
in its caller's count. A caller's count less its children's counts is therefore the
samples whose innermost frame was one of its children: that child's own time when it
is the only child; with several children the counts cannot tell which one, and the
samples go to one frame that names them all (``a | b``), said rather than guessed.
"""
from __future__ import annotations

import heapq
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

#: Separator of the candidates' names in a frame of samples not told apart
UNRESOLVED_SEPARATOR = " | "
#: At most this many candidates named in such a frame (then an ellipsis)
MAX_CANDIDATES_NAMED = 4
#: The frame that holds the samples of the stacks left out past the cap
LEFT_OUT_NAME = "(other stacks)"
#: Deeper trees are cut here (distributed keeps at most 100 frames a stack)
MAX_DEPTH = 256
#: The speedscope file format's schema (https://www.speedscope.app)
SPEEDSCOPE_SCHEMA = "https://www.speedscope.app/file-format-schema.json"


@dataclass(frozen=True)
class Frame:
    """A function as distributed identifies it: name, file, first line."""

    name: str
    file: str
    line: int

    @property
    def location(self) -> str:
        """``file:line`` with the file shortened (after ``site-packages/``, else its
        base name); the file alone without a line (samples not told apart, of
        functions of one file); empty for a frame without a file."""
        if not self.file:
            return ""
        return f"{short_file(self.file)}:{self.line}" if self.line > 0 \
            else short_file(self.file)


@dataclass
class Node:
    """A call tree node: ``total`` samples with this frame on the stack, ``own`` of
    them with it innermost (``total == own + sum of the children's totals``)."""

    frame: Frame
    total: int = 0
    own: int = 0
    children: dict[Frame, Node] = field(default_factory=dict)
    #: A frame of samples whose innermost function the counts cannot tell apart
    unresolved: bool = False


ROOT = Frame("root", "", 0)


def short_file(path: str) -> str:
    """A file as ``dask.profile.top`` says it: the part after the last
    ``site-packages/`` (or ``dist-packages/``), else the base name."""
    for marker in ("site-packages/", "dist-packages/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker):]
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def _frame_of(raw: Mapping[str, object]) -> Frame:
    ident = raw.get("identifier")
    if not isinstance(ident, str):
        raise ValueError(f"a profile node without an identifier: {ident!r:.80}")
    parts = ident.split(";")
    if len(parts) == 3 and parts[2].lstrip("-").isdigit():
        return Frame(parts[0], parts[1], int(parts[2]))
    return Frame(ident, "", 0)


def _count_of(raw: Mapping[str, object]) -> int:
    count = raw.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"a profile node's count is not a count: {count!r:.80}")
    return count


def _children_of(raw: Mapping[str, object]) -> list[Mapping[str, object]]:
    children = raw.get("children", {})
    if not isinstance(children, Mapping):
        raise ValueError("a profile node's children are not a mapping")
    out = []
    for child in children.values():
        if not isinstance(child, Mapping):
            raise ValueError("a profile node is not a mapping")
        out.append(child)
    return out


def _unresolved_frame(children: Sequence[tuple[Frame, int]]) -> Frame:
    # the children that only ever were innermost first (they hold some for certain)
    ordered = [f for f, c in children if c == 0] + [f for f, c in children if c]
    names = [f.name for f in ordered[:MAX_CANDIDATES_NAMED]]
    if len(ordered) > MAX_CANDIDATES_NAMED:
        names.append("…")
    files = {f.file for f in ordered}
    file = files.pop() if len(files) == 1 else ""
    line = ordered[0].line if len(ordered) == 1 else 0
    return Frame(UNRESOLVED_SEPARATOR.join(names), file, line)


def _read(raw: Mapping[str, object], node: Node, innermost: int, depth: int) -> None:
    """Fill ``node`` from the raw node, which was innermost in ``innermost`` samples
    (as its caller's counts tell)."""
    count = _count_of(raw)
    node.own += innermost
    node.total += count + innermost
    if depth >= MAX_DEPTH:
        node.own += count
        return
    raws = _children_of(raw)
    frames = [(_frame_of(c), _count_of(c)) for c in raws]
    excess = count - sum(c for _, c in frames)
    if excess < 0:  # not as distributed counts: keep what the children say
        node.total -= excess
        excess = 0
    single = len(raws) == 1
    for child_raw, (frame, _) in zip(raws, frames, strict=True):
        child = node.children.get(frame)
        if child is None:
            child = node.children[frame] = Node(frame)
        _read(child_raw, child, excess if single else 0, depth + 1)
    if not raws:
        node.own += excess  # a node that called deeper and has no child: its own
    elif not single and excess:
        frame = _unresolved_frame(frames)
        child = node.children.get(frame)
        if child is None:
            child = node.children[frame] = Node(frame, unresolved=True)
        child.total += excess
        child.own += excess
    for frame in [f for f, c in node.children.items() if not c.total]:
        del node.children[frame]


def read_tree(raw: Mapping[str, object]) -> Node:
    """A worker's profile tree (``Worker.get_profile``, ``distributed.profile.merge``)
    as a call tree with own samples; raises :class:`ValueError` for what is not one."""
    if not isinstance(raw, Mapping):
        raise ValueError("a profile is not a mapping")
    root = Node(ROOT)
    _read(raw, root, 0, 0)
    return root


def merge_into(target: Node, other: Node) -> None:
    """Add ``other``'s samples to ``target`` (two trees of the same frame)."""
    target.total += other.total
    target.own += other.own
    for frame, child in other.children.items():
        mine = target.children.get(frame)
        if mine is None:
            mine = target.children[frame] = Node(frame, unresolved=child.unresolved)
        merge_into(mine, child)


def merged(trees: Iterable[Node]) -> Node:
    """One tree of all ``trees``' samples."""
    root = Node(ROOT)
    for tree in trees:
        merge_into(root, tree)
    return root


def stacks(root: Node) -> list[tuple[tuple[Frame, ...], int]]:
    """Every stack that holds own samples, outermost frame first, with their count."""
    out: list[tuple[tuple[Frame, ...], int]] = []
    todo: list[tuple[Node, tuple[Frame, ...]]] = [(c, (c.frame,))
                                                  for c in root.children.values()]
    while todo:
        node, path = todo.pop()
        if node.own:
            out.append((path, node.own))
        todo.extend((c, (*path, c.frame)) for c in node.children.values())
    if root.own:
        out.append(((), root.own))
    return out


def from_stacks(entries: Iterable[tuple[Sequence[Frame], int]],
                unresolved: frozenset[Frame] = frozenset()) -> Node:
    """A call tree from stacks and their own samples."""
    root = Node(ROOT)
    for path, n in entries:
        node = root
        node.total += n
        for frame in path:
            child = node.children.get(frame)
            if child is None:
                child = node.children[frame] = Node(frame,
                                                    unresolved=frame in unresolved)
            child.total += n
            node = child
        node.own += n
    return root


def _unresolved_frames(root: Node) -> frozenset[Frame]:
    found: set[Frame] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if node.unresolved:
            found.add(node.frame)
        todo.extend(node.children.values())
    return frozenset(found)


def capped(root: Node, max_stacks: int) -> tuple[Node, int]:
    """``root`` with at most ``max_stacks`` stacks, the ones with the most samples;
    the others' samples on one :data:`LEFT_OUT_NAME` frame. Also returns how many
    stacks were left out."""
    every = stacks(root)
    if len(every) <= max_stacks:
        return root, 0
    keep = max(max_stacks - 1, 0)
    kept = heapq.nlargest(keep, every, key=lambda e: e[1])
    left = sum(n for _, n in every) - sum(n for _, n in kept)
    kept.append(((Frame(LEFT_OUT_NAME, "", 0),), left))
    return from_stacks(kept, _unresolved_frames(root)), len(every) - keep


def own_by_function(root: Node) -> dict[Frame, int]:
    """Own samples per function, wherever it sits in the tree (recursion included,
    each sample counted once)."""
    out: dict[Frame, int] = {}
    todo = [root]
    while todo:
        node = todo.pop()
        if node.own and node is not root:
            out[node.frame] = out.get(node.frame, 0) + node.own
        todo.extend(node.children.values())
    return out


def hottest(root: Node, n: int) -> list[str]:
    """``dask.profile.top``: the ``n`` functions with the most own samples, hottest
    first, as ``function (file:line) NN%`` (of all samples; ``<1%`` below one)."""
    if root.total <= 0 or n <= 0:
        return []
    by_function = own_by_function(root)
    top = sorted(by_function.items(), key=lambda e: (-e[1], e[0].name, e[0].file))[:n]
    out = []
    for frame, own in top:
        pct = 100.0 * own / root.total
        said = f"{pct:.0f}%" if pct >= 0.5 else "<1%"
        where = f" ({frame.location})" if frame.location else ""
        out.append(f"{frame.name}{where} {said}")
    return out


def to_wire(root: Node) -> list[object]:
    """The tree as plain lists (marshal, JSON): ``[name, file, line, total, own,
    unresolved, [children...]]``."""
    f = root.frame
    return [f.name, f.file, f.line, root.total, root.own, root.unresolved,
            [to_wire(c) for c in root.children.values()]]


def from_wire(data: Sequence[object], depth: int = 0) -> Node:
    """The tree :func:`to_wire` gave; raises :class:`ValueError` for anything else."""
    try:
        name, file, line, total, own, unresolved, children = data
    except (TypeError, ValueError):
        raise ValueError("not a profile tree") from None
    if not (isinstance(name, str) and isinstance(file, str) and isinstance(line, int)
            and isinstance(total, int) and isinstance(own, int)
            and isinstance(children, (list, tuple))) or depth > MAX_DEPTH:
        raise ValueError("not a profile tree")
    node = Node(Frame(name, file, line), total, own, unresolved=bool(unresolved))
    for c in children:
        child = from_wire(c, depth + 1)
        node.children[child.frame] = child
    return node


def speedscope(profiles: Sequence[tuple[str, Node]], name: str,
               exporter: str) -> dict[str, object]:
    """A speedscope file (``sampled`` profiles, weights in samples) of the named
    trees: one profile each, the frames shared."""
    frames: dict[Frame, int] = {}
    shared: list[dict[str, object]] = []

    def index(frame: Frame) -> int:
        i = frames.get(frame)
        if i is None:
            i = frames[frame] = len(shared)
            entry: dict[str, object] = {"name": frame.name}
            if frame.file:
                entry["file"] = frame.file
                entry["line"] = frame.line
            shared.append(entry)
        return i

    out = []
    for title, root in profiles:
        samples, weights = [], []
        for path, n in sorted(stacks(root), key=lambda e: [f.name for f in e[0]]):
            samples.append([index(f) for f in path])
            weights.append(n)
        out.append({"type": "sampled", "name": title, "unit": "none",
                    "startValue": 0, "endValue": sum(weights),
                    "samples": samples, "weights": weights})
    return {"$schema": SPEEDSCOPE_SCHEMA, "name": name, "exporter": exporter,
            "activeProfileIndex": 0, "shared": {"frames": shared}, "profiles": out}


def speedscope_json(profiles: Sequence[tuple[str, Node]], name: str,
                    exporter: str) -> str:
    """:func:`speedscope` as the file's text."""
    return json.dumps(speedscope(profiles, name, exporter), separators=(",", ":"))


#: The folder of the profile files, below the embedded default's directory
PROFILES_DIR = "profiles"
#: The end of a profile file's name
PROFILE_SUFFIX = ".speedscope.json"


def profile_file_name(trace_id: int, span_id: int) -> str:
    """A dask span's profile file: its OTel trace and span ids, in hex."""
    return f"{trace_id:032x}-{span_id:016x}{PROFILE_SUFFIX}"


def profile_file(directory: str, trace_id: int, span_id: int) -> str:
    """Where the profiles of the dask span with these OTel ids are written, below
    the embedded default's ``directory``."""
    return os.path.join(directory, PROFILES_DIR, profile_file_name(trace_id, span_id))


def prefix_of_title(title: str) -> str:
    """The prefix a profile of a speedscope file is of (its name is ``prefix (dask
    span name)``)."""
    return title.split(" (", 1)[0]


def read_speedscope(text: str) -> list[tuple[str, Node]]:
    """The named call trees of a speedscope file of ``sampled`` profiles (as
    :func:`speedscope` writes them); raises :class:`ValueError` for anything else."""
    try:
        doc = json.loads(text)
        frames = [Frame(str(f["name"]), str(f.get("file", "")), int(f.get("line", 0)))
                  for f in doc["shared"]["frames"]]
        out = []
        for profile in doc["profiles"]:
            if profile.get("type") != "sampled":
                continue
            stacks_ = [([frames[i] for i in sample], int(weight)) for sample, weight
                       in zip(profile["samples"], profile["weights"], strict=True)]
            unresolved = frozenset(f for path, _ in stacks_ for f in path
                                   if UNRESOLVED_SEPARATOR in f.name)
            out.append((str(profile["name"]), from_stacks(stacks_, unresolved)))
    except (KeyError, TypeError, IndexError, ValueError) as e:
        raise ValueError(f"not a speedscope file of sampled profiles ({e})") from None
    return out
