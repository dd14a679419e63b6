"""A real headless Chromium (Debian's ``chromium``): a page opened as a user would open
a file, with a probe put at its very start that records uncaught errors, console
errors and every resource the page requests (the Resource Timing API), then written
into the DOM that Chromium dumps."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

#: Chromium's own background traffic off: the page is all there is
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-default-apps", "--hide-scrollbars"]

PROBE = """<script>
window.__probe = {errors: []};
window.addEventListener("error", function(e){ __probe.errors.push(String(e.message)); });
(function(){ var original = console.error; console.error = function(){
  __probe.errors.push(Array.prototype.join.call(arguments, " "));
  original.apply(console, arguments); }; })();
window.addEventListener("load", function(){ setTimeout(function(){
  var b = document.body;
  b.setAttribute("data-probe-errors", JSON.stringify(__probe.errors));
  b.setAttribute("data-probe-resources", JSON.stringify(
    performance.getEntriesByType("resource").map(function(e){ return e.name; })));
}, 0); });
</script>"""


def chromium() -> str:
    """The Chromium binary (``apt-get install -y chromium``)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Chromium is needed for the report's browser tests: apt-get install -y chromium"
    return found


def probed_copy(page: Path, where: Path) -> Path:
    """A copy of ``page`` with the probe as the first thing in its ``<head>``."""
    text = page.read_text(encoding="utf-8")
    copy = where / f"probed-{page.name}"
    copy.write_text(text.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    return copy


def dump_dom(page: Path, timeout: float = 60) -> str:
    """The DOM of ``page`` once its scripts ran, as Chromium serializes it."""
    proc = subprocess.run(
        [chromium(), *FLAGS, "--virtual-time-budget=10000", "--dump-dom",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def screenshot(page: Path, out: Path, timeout: float = 60) -> Path:
    subprocess.run(
        [chromium(), *FLAGS, "--window-size=1400,1000", "--virtual-time-budget=10000",
         f"--screenshot={out}", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=timeout, check=True)
    return out


def body_attribute(dom: str, name: str) -> str | None:
    match = re.search(rf'<body[^>]*\s{re.escape(name)}="([^"]*)"', dom)
    if match is None:
        return None
    import html

    return html.unescape(match.group(1))
