"""The report's flame graphs: the profile of each prefix span (the speedscope files
beside the traces), drawn in the span's details when its row is clicked; a frame
clicked zooms to it, hovering says its counts. Self-contained, as the page."""
from __future__ import annotations

import os
from collections.abc import Iterable

from dask_otel_spans import names
from dask_otel_spans.protocol.profiles import (
    PROFILE_SUFFIX,
    PROFILES_DIR,
    Node,
    prefix_of_title,
    profile_file_name,
    read_speedscope,
    to_wire,
)
from dask_otel_spans.reports.model import ReportData


def _profile_files(traces_files: Iterable[str]) -> dict[str, str]:
    """File name -> path of the profile files beside the traces files."""
    found: dict[str, str] = {}
    for folder in sorted({os.path.dirname(os.path.abspath(f)) for f in traces_files}):
        where = os.path.join(folder, PROFILES_DIR)
        try:
            entries = os.listdir(where)
        except OSError:
            continue
        for name in entries:
            if name.endswith(PROFILE_SUFFIX):
                found.setdefault(name, os.path.join(where, name))
    return found


def _profiles_of(files: dict[str, str], trace_id: str,
                 span_id: str) -> list[tuple[str, Node]]:
    """The profiles of a dask span's file, none when it has none or it cannot be
    read."""
    try:
        path = files.get(profile_file_name(int(trace_id, 16), int(span_id, 16)))
        if path is None:
            return []
        with open(path, encoding="utf-8") as f:
            return read_speedscope(f.read())
    except (OSError, ValueError):
        return []


def flame_trees(traces_files: Iterable[str], data: ReportData) -> dict[str, list[object]]:
    """Prefix span row id -> its profile's call tree (the wire form of
    :mod:`~dask_otel_spans.protocol.profiles`), for the prefix spans whose dask
    span has a profile file beside the traces files. A file that cannot be read
    is left out."""
    files = _profile_files(traces_files)
    if not files:
        return {}
    out: dict[str, list[object]] = {}
    for trace in data["traces"]:
        prefixes: dict[str, dict[str, str]] = {}
        for row in trace["rows"]:
            if row["kind"] == "prefix" and row["parent"] and row["id"]:
                prefix = str(row["attrs"].get(names.TASK_PREFIX, row["name"]))
                prefixes.setdefault(row["parent"], {})[prefix] = row["id"]
        for row in trace["rows"]:
            below = prefixes.get(row["id"] or "")
            if row["kind"] != "dask" or not below:
                continue
            for title, tree in _profiles_of(files, trace["trace_id"], str(row["id"])):
                row_id = below.get(prefix_of_title(title))
                if row_id is not None and tree.total:
                    out[row_id] = to_wire(tree)
    return out


STYLE = """
.flame{position:relative;margin:6px 0 4px;font-size:11px}
.flame .frame{position:absolute;height:16px;box-sizing:border-box;overflow:hidden;
 white-space:nowrap;text-overflow:ellipsis;border:1px solid #fff;padding:0 3px;
 line-height:14px;cursor:pointer;color:#222}
.flame .frame:hover{filter:brightness(0.92)}.flame .frame.above{background:#ddd;color:#666}
.flame-help{color:#666;font-size:11px}.tag.profile{background:#fde7c8}
"""

SCRIPT = r"""
(function(){
"use strict";
var el = document.getElementById("report-profiles"); if (!el) return;
var profiles = JSON.parse(el.textContent);
function esc(s){return String(s).replace(/[&<>"']/g,function(c){return {"&":"&amp;",
 "<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c];});}
Object.keys(profiles).forEach(function(id){
  var row = document.getElementById("row-"+id); if (!row) return;
  row.classList.add("profiled");
  var label = row.querySelector(".label");
  if (label){label.insertAdjacentHTML("beforeend",
   ' <span class="tag profile" title="click the row for its flame graph">profile</span>');}
});
// a node: [name, file, line, total, own, unresolved, children]
function where(n){var f = n[1].split("/").pop(); return f ? f+":"+n[2] : "";}
function colour(n){
  if (n[5] || !n[1]) return "#cfcfcf";
  var h = 0, s = n[1]||n[0]; for (var i = 0; i < s.length; i++){h = (h*31+s.charCodeAt(i))|0;}
  return "hsl("+(20+Math.abs(h)%40)+",85%,"+(62+Math.abs(h>>8)%14)+"%)";}
function label(n){return n[0]+(where(n)?" ("+where(n)+")":"");}
function draw(box, root, path){
  // the focus: the node at ``path`` (child indices from the root); above it its
  // ancestors, full width (a click zooms back out to one)
  var chain = [root], node = root;
  path.forEach(function(i){node = node[6][i]; chain.push(node);});
  var all = root[3], parts = [], depth = 0, width = box.clientWidth || 340;
  function frame(n, p, left, pct, cls){
    var share = (n[3]/all*100).toFixed(1);
    parts.push('<div class="frame'+cls+'" data-path="'+p.join(".")+'" data-name="'+
     esc(n[0])+'" data-total="'+n[3]+'" data-own="'+n[4]+'" title="'+esc(label(n))+'\n'+
     n[3]+' samples ('+share+'% of '+all+'), '+n[4]+' own'+(n[5]?
     ' (callees the counts cannot tell apart)':'')+'" style="left:'+left.toFixed(4)+
     '%;width:'+pct.toFixed(4)+'%;top:'+(depth*16)+'px;background:'+colour(n)+'">'+
     esc(n === root ? "all ("+all+" samples)" : label(n))+'</div>');}
  chain.slice(0, -1).forEach(function(n, d){
    frame(n, path.slice(0, d), 0, 100, " above"); depth++;});
  (function walk(n, p, left, pct){
    frame(n, p, left, pct, ""); depth++;
    var x = left, order = n[6].map(function(c, i){return i;}).sort(function(a, b){
      return n[6][b][3]-n[6][a][3];});
    order.forEach(function(i){
      var c = n[6][i], w = pct*c[3]/Math.max(n[3], 1);
      if (w/100*width >= 2) walk(c, p.concat([i]), x, w);
      x += w;});
    depth--;
  })(node, path, 0, 100);
  box.innerHTML = parts.join("");
  box.style.height = (box.querySelectorAll(".frame").length ?
   16*(1+Math.max.apply(null, Array.prototype.map.call(box.querySelectorAll(".frame"),
   function(f){return parseInt(f.style.top, 10)/16;}))) : 0)+"px";
  box.dataset.focus = node === root ? "" : node[0];
}
document.getElementById("traces").addEventListener("click", function(e){
  var row = e.target.closest(".row"); if (!row) return;
  if (e.target.classList.contains("toggle") && e.target.textContent) return;
  var tree = profiles[row.dataset.id]; if (!tree) return;
  var details = document.getElementById("details");
  var box = document.createElement("div"); box.className = "flame"; box.id = "flame";
  var help = document.createElement("div"); help.className = "flame-help";
  help.innerHTML = '<h2>Profile</h2>'+tree[3]+' samples of the workers\' profiler: '+
   'click a frame to zoom to it, a grey one to zoom out; hover for its counts';
  var after = details.querySelector("h2 ~ div") || details.firstChild;
  details.insertBefore(box, after ? after.nextSibling : null);
  details.insertBefore(help, box);
  box.addEventListener("click", function(ev){
    var f = ev.target.closest(".frame"); if (!f) return;
    draw(box, tree, f.dataset.path ? f.dataset.path.split(".").map(Number) : []);});
  draw(box, tree, []);
});
})();
"""
