"""``dask-otel-spans``: ``demo`` runs a small real workflow on a LocalCluster with the
plugins (scheduler and workers) and prints the exported span tree
(:mod:`~dask_otel_spans.demo`); ``tree [PATH ...]`` prints it from saved files,
``report [PATH ...]`` writes their HTML report; ``resend DIR`` sends what a spool
directory holds."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections import defaultdict
from collections.abc import Mapping, Sequence

from dask_otel_spans import names
from dask_otel_spans.reports.model import (
    IN_TASK,
    FileSpan,
    Logged,
    SpanKey,
    kind_of,
    task_label,
)
from dask_otel_spans.reports.report import DEFAULT_DIRECTORY
from dask_otel_spans.reports.running import is_running, running_label
from dask_otel_spans.reports.sources import NotATracesFile, read_files, traces_files_of
from dask_otel_spans.sdk.otlpjson import exception_logs
from dask_otel_spans.wording import counted

# -- rendering --------------------------------------------------------------------------


def _top_activities(attributes: Mapping[str, object], n: int = 3) -> str:
    prefix = names.METRICS_ATTRIBUTE_PREFIX
    seconds = []
    for key, value in attributes.items():
        if key.startswith(prefix) and key.endswith(".seconds"):
            activity = key[len(prefix) : -len(".seconds")]
            if isinstance(value, (int, float)) and value > 0:
                seconds.append((value, activity))
    seconds.sort(reverse=True)
    return ", ".join(f"{a} {v:.3g}s" for v, a in seconds[:n])


def escaped(text: str) -> str:
    """``text`` with each character that is not printable (control characters: ESC,
    carriage return, newline, bell, the C1 controls; format characters such as the
    bidirectional overrides) escaped as Python's ``repr`` writes it (``\\x1b``,
    ``\\n``, ``\\u202e``), as dask's own log writes a task's exception (``%r``): what
    a file holds cannot recolour, move the cursor in or rewrite the terminal."""
    if text.isprintable():
        return text
    return "".join([c if c.isprintable() else repr(c)[1:-1] for c in text])


def _exception_of(span: FileSpan, logged: Logged) -> Mapping[str, object] | None:
    """The exception of a span that erred (its ``exception`` event, its exception log
    event in ``logged``, else its ``error.type`` or error status); None when it did not
    err."""
    fields: Mapping[str, object] | None = logged.get((span.get("traceId"), span.get("spanId")))
    for event in span.get("events") or ():
        if event.get("name") == names.EXCEPTION_EVENT:
            fields = {a["key"]: a["value"].get("stringValue", "")
                      for a in event.get("attributes") or ()}
    attrs = span.get("attributes") or {}
    if fields is None and names.ERROR_TYPE in attrs:
        fields = {names.EXCEPTION_TYPE: attrs[names.ERROR_TYPE]}
    if fields is None and (span.get("status") or {}).get("code") in (2, "STATUS_CODE_ERROR"):
        fields = {names.EXCEPTION_MESSAGE: (span.get("status") or {}).get("message", "")}
    return fields


def _described(fields: Mapping[str, object]) -> str:
    """``Type: message`` of an exception's fields."""
    message = fields.get(names.EXCEPTION_MESSAGE, "")
    return (f"{fields.get(names.EXCEPTION_TYPE, 'Exception')}"
            + (f": {message}" if message else ""))


def _task_line(span: FileSpan, duration: float, logged: Logged) -> str:
    """A task span (:func:`~dask_otel_spans.reports.model.task_label`, as the report
    names it): ``✗`` and its exception when it erred."""
    line = f"{task_label(span)}  {duration:.3f}s"
    fields = _exception_of(span, logged)
    return f"- {line}" if fields is None else f"✗ {line}  {_described(fields)}"


def _tree_line(s: FileSpan, kind: str, duration: float, logged: Logged) -> str:
    """A span's line of the text tree (without its indent)."""
    attrs = s["attributes"]
    if names.SPAN_ID in attrs and is_running(attrs):
        # (started, not ended: from the records of logs.jsonl)
        return f"{s['name']}  [{running_label(attrs)}]"
    if names.SPAN_ID in attrs:
        flags = []
        if attrs.get(names.SPAN_INCOMPLETE):
            flags.append("incomplete")
        if attrs.get(names.SPAN_ERRED_COUNT):
            flags.append(f"{attrs[names.SPAN_ERRED_COUNT]} erred")
        top = _top_activities(attrs)
        return (f"{s['name']}  {duration:.3f}s  "
                + counted(attrs.get(names.SPAN_TASK_COUNT, 0), "task")
                + (f"  [{', '.join(flags)}]" if flags else "")
                + (f"  | {top}" if top else ""))
    if names.TASK_KEY in attrs:
        return _task_line(s, duration, logged)
    if names.TASK_PREFIX in attrs:
        top = _top_activities(attrs, 2)
        left_out = attrs.get(names.TASK_SPANS_LEFT_OUT)
        return (f"· {s['name']}  {duration:.3f}s  "
                + counted(attrs.get(names.TASK_GROUP_TASK_COUNT, 0), "task")
                + (f"  | {top}" if top else "")
                + (f"  (+{counted(left_out, 'task span')} left out)" if left_out else ""))
    where = "in a task" if kind == IN_TASK else "client span"
    line = f"{s['name']}  {duration:.3f}s  ({where})"
    fields = _exception_of(s, logged)
    return line if fields is None else f"✗ {line}  {_described(fields)}"


def render_tree(spans: Sequence[FileSpan], logged: Logged | None = None) -> str:
    """Text tree of OTLP/JSON spans (as
    :func:`~dask_otel_spans.sdk.otlpjson.read_spans` reads them):
    per dask span its duration, task count and top activities; task prefixes below
    (``·``), their task spans (``✗`` erred, with the exception of its event or of
    its log event in ``logged``, see
    :func:`~dask_otel_spans.sdk.otlpjson.exception_logs`; ``-`` others) and spans
    made in tasks. Characters that are not printable are escaped (:func:`escaped`)."""
    logged = logged or {}
    by_id = {(s.get("traceId"), s.get("spanId")): s for s in spans}
    children: dict[SpanKey, list[FileSpan]] = defaultdict(list)
    roots = []
    for s in spans:
        parent = (s.get("traceId"), s.get("parentSpanId"))
        if s.get("parentSpanId") and parent in by_id:
            children[parent].append(s)
        else:
            roots.append(s)

    def start(s: FileSpan) -> int:
        return int(s.get("startTimeUnixNano", 0))

    lines: list[str] = []

    def walk(s: FileSpan, depth: int, parent_kind: str | None = None) -> None:
        kind = kind_of(s, parent_kind)
        duration = (int(s.get("endTimeUnixNano", 0)) - start(s)) / 1e9
        lines.append("  " * depth + _tree_line(s, kind, duration, logged))
        kids = children.get((s.get("traceId"), s.get("spanId")), [])
        # dask spans first, then task prefixes, each by start time
        kids.sort(key=lambda k: (names.TASK_PREFIX in k["attributes"]
                                 and names.TASK_KEY not in k["attributes"], start(k)))
        for k in kids:
            walk(k, depth + 1, kind)

    traces: dict[str, list[FileSpan]] = defaultdict(list)
    for r in roots:
        traces[r.get("traceId", "")].append(r)
    for trace_id, trace_roots in sorted(
        traces.items(), key=lambda kv: min(start(r) for r in kv[1])
    ):
        lines.append(f"trace {trace_id}")
        for r in sorted(trace_roots, key=start):
            at = len(lines)
            walk(r, 1)
            if r.get("parentSpanId"):  # not in these files: e.g. the application's own
                lines[at] += f"  (parent {r['parentSpanId']} elsewhere)"

    # (one line per span, whatever the files hold: names, keys and exception
    # messages are anyone's text)
    return "\n".join([escaped(line) for line in lines])


def span_tree(files: Sequence[str], spans: Sequence[FileSpan]) -> str:
    """The text tree of ``spans`` (of traces ``files``, as
    :func:`~dask_otel_spans.reports.sources.read_files` reads them) as
    ``dask-otel-spans tree`` prints it: with the exceptions of the exception log
    events in the ``logs.jsonl`` beside ``files``."""
    return render_tree(spans, exception_logs(files))


#: What a bad path given to ``tree`` or ``report`` raises: said in one line
_BAD_PATH = (OSError, NotATracesFile)


def cmd_report(args: argparse.Namespace) -> int:
    from dask_otel_spans.reports.report import Report

    try:
        made = Report(args.paths)
        if not made.summary["spans"]:  # (as tree says it: no report of nothing)
            print(f"no spans in {', '.join(made.files)}", file=sys.stderr)
            return 1
        if args.output == "-":  # (the page on standard output, nothing else there)
            sys.stdout.write(made.html())
            return 0
        path = made.save(args.output)
    except _BAD_PATH as e:
        print(e, file=sys.stderr)
        return 1
    s = made.summary
    print(f"Report of {counted(s['traces'], 'trace')}, {counted(s['spans'], 'span')} "
          f"({counted(s['tasks'], 'task')}, {s['erred']} erred): {path}")
    return 0


def cmd_tree(args: argparse.Namespace) -> int:
    try:
        files = traces_files_of(args.paths)
        text = span_tree(files, read_files(files))
    except _BAD_PATH as e:
        print(e, file=sys.stderr)
        return 1
    if not text:
        print(f"no spans in {', '.join(files)}", file=sys.stderr)
        return 1
    print(text)
    return 0


def cmd_resend(args: argparse.Namespace) -> int:
    from dask_otel_spans.otelenv import ConfigurationError
    from dask_otel_spans.protocol.outcome import describe, settled
    from dask_otel_spans.sdk.resend import resend

    if not os.path.isdir(args.directory):
        print(f"no such directory: {args.directory}", file=sys.stderr)
        return 1
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    # (what the spool held is said, at INFO: sending it is what was asked)
    logging.getLogger("dask_otel_spans").setLevel(logging.INFO)
    try:
        outcome = resend(args.directory, os.environ, args.timeout,
                         any_destination=args.any_destination)
    except ConfigurationError as e:
        print(f"dask-otel-spans resend: {e}", file=sys.stderr)
        return 2
    if not outcome.resent and not outcome.left:
        print(f"nothing to send in {args.directory} (or only batches of running "
              "export processes)")
        return 0
    for resent in outcome.resent:
        print(describe(resent.figures, resent.signal, resent.where,
                       spool_directory=args.directory, resending=True))
    for line in outcome.left:
        print(line)
    return 0 if not outcome.left and all(
        settled(r.figures) for r in outcome.resent) else 1


def main(argv: Sequence[str] | None = None) -> int:
    # (the demo's module reads the tree's rendering from this one)
    from dask_otel_spans.demo import DEMO_EXPORT_DELAY, cmd_demo

    parser = argparse.ArgumentParser(
        prog="dask-otel-spans",
        description="Dask spans and fine performance metrics as OpenTelemetry data",
    )
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {names.VERSION}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="run a small workflow on a LocalCluster and print its span tree"
    )
    demo.add_argument(
        "--output-dir",
        help="directory of the embedded default exporter; an earlier run's files "
             "there are moved to earlier-runs/<time>/ first (default: "
             "otel-spans.output-dir, e.g. DASK_OTEL_SPANS__OUTPUT_DIR, else "
             f"{DEFAULT_DIRECTORY})",
    )
    demo.add_argument("--workers", type=int, default=2,
                      help="worker processes of the LocalCluster, 2 threads each "
                           "(default: %(default)s)")
    demo.add_argument(
        "--export-delay", metavar="DURATION",
        help="how long a done span waits for late heartbeats before it is exported, "
             "e.g. 2s (default: otel-spans.export-delay when set, as "
             f"DASK_OTEL_SPANS__EXPORT_DELAY or in dask's config, else "
             f"{DEMO_EXPORT_DELAY})")
    demo.set_defaults(func=cmd_demo)
    paths_help = ("traces files or directories of the embedded default (default: "
                  f"{DEFAULT_DIRECTORY})")
    tree = sub.add_parser("tree", help="print the span tree of saved OTLP-JSON lines")
    tree.add_argument("paths", nargs="*", default=[DEFAULT_DIRECTORY], metavar="PATH",
                      help=paths_help)
    tree.set_defaults(func=cmd_tree)
    report = sub.add_parser(
        "report", help="write a self-contained HTML report of saved OTLP-JSON lines")
    report.add_argument("paths", nargs="*", default=[DEFAULT_DIRECTORY], metavar="PATH",
                        help=paths_help)
    report.add_argument("-o", "--output", default="report.html",
                        help="the HTML file to write, - for standard output "
                             "(default: %(default)s)")
    report.set_defaults(func=cmd_report)
    resend = sub.add_parser(
        "resend", help="send the batches a spool directory holds (otel-spans.spool."
                       "directory), each to the OTLP endpoint it was held for, with the "
                       "credentials of the OTEL_EXPORTER_OTLP_* variables when they are "
                       "the ones it was held with")
    resend.add_argument("directory", help="the spool directory")
    resend.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to keep trying (default: %(default)s)")
    resend.add_argument("--any-destination", action="store_true",
                        help="send every batch to the OTLP endpoint of the "
                             "OTEL_EXPORTER_OTLP_* variables, with their credentials, "
                             "whatever destination it was held for")
    resend.set_defaults(func=cmd_resend)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        code: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        return _output_closed()
    return code


#: The exit status of a command whose output was closed early (``| head``): the
#: shell's for a process that SIGPIPE ended, as other Unix tools give it
EXIT_OUTPUT_CLOSED = 128 + 13


def _output_closed() -> int:
    """Stop writing to a standard output its reader closed (``... | head``), quietly:
    what is still buffered, and any later print, goes to ``/dev/null`` (Python
    flushes it at exit, which would fail again)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # (not a file: e.g. replaced in a test)
        sys.stdout = os.fdopen(devnull, "w")
    else:
        os.close(devnull)
    return EXIT_OUTPUT_CLOSED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
