"""The report as one self-contained HTML page: the data inline as JSON, the styles
and the script that draws it inline; nothing is fetched when it is opened."""
from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping

from dask_otel_spans.reports.flames import SCRIPT, STYLE
from dask_otel_spans.reports.model import ACTIVITY_ORDER, ReportData

#: Bokeh's Viridis11, which dask's Fine Performance Metrics dashboard spreads over the
#: activities it shows (``FinePerformanceMetrics._get_palette``)
VIRIDIS11 = ("#440154", "#482374", "#404387", "#345E8D", "#29788E", "#208F8C",
             "#22A784", "#42BE71", "#79D151", "#BADE27", "#FDE724")


def interpolated(palette: tuple[str, ...], n: int) -> list[str]:
    """``n`` colours spread evenly over ``palette``, linearly between its colours (as
    Bokeh's ``interp_palette``, which dask uses)."""
    rgb = [tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in palette]
    out = []
    for k in range(n):
        x = k * (len(rgb) - 1) / max(n - 1, 1)
        i = min(int(x), len(rgb) - 2)
        f = x - i
        out.append("#" + "".join(f"{round(a + (b - a) * f):02X}"
                                 for a, b in zip(rgb[i], rgb[i + 1], strict=True)))
    return out


def activity_colours(data: ReportData) -> dict[str, str]:
    """A colour per activity the report shows, dask's way: Viridis11 spread over the
    activities present (in dask's order, :data:`ACTIVITY_ORDER`, then by name), so an
    activity has one colour across spans and few activities stay far apart."""
    present = {activity for trace in data["traces"] for row in trace["rows"]
               for activity, _ in row["breakdown"]}
    order = {activity: i for i, activity in enumerate(ACTIVITY_ORDER)}
    shown = sorted(present, key=lambda a: (order.get(a, len(order)), a))
    return dict(zip(shown, interpolated(VIRIDIS11, len(shown)), strict=True))

_STYLE = """
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222}
header{padding:12px 18px;background:#f4f4f4;border-bottom:1px solid #ddd}
h1{font-size:17px;margin:0 0 6px}h2{font-size:14px;margin:18px 0 6px}
.summary span{margin-right:18px}.summary b{font-size:15px}
main{display:flex;align-items:flex-start}#traces{flex:1;padding:0 18px 40px;min-width:0}
#details{width:380px;position:sticky;top:0;max-height:100vh;overflow:auto;
 border-left:1px solid #ddd;padding:10px 14px;background:#fafafa;font-size:12px}
.trace{margin-top:14px}.row{display:flex;align-items:center;height:20px;cursor:pointer;
 border-bottom:1px solid #f0f0f0}.row:hover{background:#f3f7ff}.row.selected{background:#e3ecff}
.label{width:38%;min-width:0;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.toggle{display:inline-block;width:14px;color:#888}.lane{flex:1;position:relative;height:14px}
.bar{position:absolute;top:1px;height:12px;min-width:1px;border-radius:2px;background:#7aa6da}
.dask .bar{background:#4c72b0}.prefix .bar{background:#8fb3de}.task .bar{background:#b9cfe9}
.in-task .bar,.client .bar{background:#9c9c9c}.erred .bar{background:#d62728}
.erred .label{color:#b00}.dur{width:80px;text-align:right;color:#555;font-variant-numeric:tabular-nums}
.mix{width:120px;flex:none;height:10px;display:flex;margin-left:8px;background:#eee}
.mix.none{background:none}.mix i{display:block;height:10px}.dur{flex:none}
.hidden{display:none}.folded .label{color:#888;font-style:italic}
.exception{display:none}pre{white-space:pre-wrap;font-size:11px;background:#fff;
 border:1px solid #ddd;padding:6px}table{border-collapse:collapse;width:100%}
td{border-bottom:1px solid #eee;padding:2px 4px;vertical-align:top;word-break:break-all}
.legend i{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px}
.tag{font-size:11px;color:#666;background:#eee;border-radius:3px;padding:0 4px}
.elsewhere{background:#fff3cd}
"""

_SCRIPT = r"""
(function(){
"use strict";
window.addEventListener("error", function(e){
  document.body.dataset.errors = (document.body.dataset.errors||"") + e.message + ";";});
var t0 = performance.now();
var data = JSON.parse(document.getElementById("report-data").textContent);
var colours = JSON.parse(document.getElementById("report-colours").textContent);
function esc(s){return String(s).replace(/[&<>"']/g,function(c){return {"&":"&amp;",
 "<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c];});}
function ms(x){return x>=1000?(x/1000).toFixed(3)+" s":x.toFixed(1)+" ms";}
function secs(x){return x.toPrecision(3)+" s";}
var TAGS = {"in-task": "in a task", "client": "client"};
var s = data.summary, parts = [];
function counted(n, thing){  // (wording.counted's rule: "1 task", "2 tasks")
  return '<span><b>'+n+'</b> '+thing+(n===1?'':'s')+'</span>';}
parts.push('<div class="summary">'+counted(s.traces,"trace")+counted(s.spans,"span")+
 counted(s.tasks,"task")+counted(s.erred,"erred task")+'</div>');
if (s.slowest.length){parts.push('<div>Slowest dask spans: '+s.slowest.map(function(x){
 return '<a href="#row-'+esc(x.id)+'" data-goto="'+esc(x.id)+'">'+esc(x.name)+'</a> '+ms(x.duration);
}).join(", ")+'</div>');}
document.getElementById("summary").innerHTML = parts.join("");
var legend = []; for (var a in colours){legend.push('<i style="background:'+colours[a]+'"></i>'+esc(a));}
document.getElementById("legend").innerHTML = legend.length ?
 'Activities (bars in seconds, one scale per trace; hover a segment for its figures):'+
 legend.join("") : "";
var byId = {}, out = [];
data.traces.forEach(function(trace, ti){
  out.push('<section class="trace"><h2>'+esc(trace.name||"trace")+' <small>trace '+
   esc(trace.trace_id)+', '+ms(trace.duration)+'</small></h2><div class="rows">');
  var total = trace.duration || 1, rows = trace.rows, scale = trace.activity_scale || 1;
  rows.forEach(function(r, i){
    byId[r.id] = r;
    var next = rows[i+1], parent = next && next.depth > r.depth;
    var cls = "row "+r.kind+(r.error?" erred":"");
    var left = Math.max(0, Math.min(100, r.start/total*100));
    var width = Math.max(0.05, Math.min(100-left, r.duration/total*100));
    var mix = '<span class="mix none"></span>';  // (every row keeps the column)
    if (r.breakdown.length){
      // one scale per trace: a bar's length is its row's activity seconds
      var sum = r.breakdown.reduce(function(a, b){return a+b[1];}, 0);
      mix = '<span class="mix" title="activity seconds, on one scale per trace">'+
       r.breakdown.map(function(b){
        return '<i data-activity="'+esc(b[0])+'" data-seconds="'+b[1]+'" title="'+
         esc(b[0])+': '+secs(b[1])+' ('+(b[1]/sum*100).toFixed(1)+' % of this span\'s '+
         secs(sum)+')" style="width:'+(b[1]/scale*100).toFixed(4)+'%;background:'+
         (colours[b[0]]||"#999")+'"></i>';
      }).join("")+'</span>';
    }
    var tag = TAGS[r.kind] ? ' <span class="tag">'+TAGS[r.kind]+'</span>' : '';
    if (r.parent_elsewhere){
      tag += ' <span class="tag elsewhere" title="its parent span is not in these files: '+
       'another process exported it (e.g. the application\'s own trace)">↑ parent '+
       esc(r.parent_elsewhere)+' elsewhere</span>';
    }
    if (r.running){
      tag += ' <span class="tag running" title="started, not ended: its last progress '+
       'record">'+esc(r.running)+'</span>';
    }
    var exc = r.error ? '<span class="exception">'+esc(r.error.type)+': '+
      esc(r.error.message)+'</span>' : '';
    out.push('<div id="row-'+esc(r.id)+'" class="'+cls+'" data-id="'+esc(r.id)+
     '" data-depth="'+r.depth+'" data-trace="'+ti+'"><span class="label" style="padding-left:'+
     (r.depth*14)+'px"><span class="toggle">'+(parent?"▾":"")+'</span>'+esc(r.name)+
     (r.error?' ✗ '+esc(r.error.type):'')+tag+'</span><span class="lane"><span class="bar" style="left:'+
     left.toFixed(4)+'%;width:'+width.toFixed(4)+'%"></span></span><span class="dur">'+
     (r.kind==="folded"?"":ms(r.duration))+'</span>'+mix+exc+'</div>');
  });
  out.push('</div></section>');
});
var traces = document.getElementById("traces");
traces.innerHTML = out.join("");
function details(r){
  var h = '<h2>'+esc(r.name)+'</h2><div>'+esc(TAGS[r.kind]||r.kind)+' span, '+
   ms(r.duration)+'</div>';
  if (r.parent_elsewhere){h += '<div>Parent span '+esc(r.parent_elsewhere)+
   ', not in these files (exported by another process)</div>';}
  if (r.error){h += '<h2>✗ '+esc(r.error.type)+'</h2><div>'+esc(r.error.message)+'</div>'+
    (r.error.stacktrace?'<pre>'+esc(r.error.stacktrace)+'</pre>':'');}
  if (r.breakdown.length){h += '<h2>Activities</h2><table>'+r.breakdown.map(function(b){
    return '<tr><td><i style="display:inline-block;width:10px;height:10px;background:'+
     (colours[b[0]]||"#999")+'"></i> '+esc(b[0])+'</td><td>'+b[1].toPrecision(3)+' s</td></tr>';
  }).join("")+'</table>';}
  h += '<h2>Attributes</h2><table>'+Object.keys(r.attrs).sort().map(function(k){
    return '<tr><td>'+esc(k)+'</td><td>'+esc(JSON.stringify(r.attrs[k]))+'</td></tr>';
  }).join("")+'</table>';
  document.getElementById("details").innerHTML = h;
}
traces.addEventListener("click", function(e){
  var row = e.target.closest(".row"); if (!row) return;
  if (e.target.classList.contains("toggle") && e.target.textContent){
    var collapse = e.target.textContent === "▾";
    e.target.textContent = collapse ? "▸" : "▾";
    var depth = +row.dataset.depth, n = row.nextElementSibling;
    while (n && +n.dataset.depth > depth){
      if (collapse) n.classList.add("hidden"); else n.classList.remove("hidden");
      n = n.nextElementSibling;
    }
    return;
  }
  var sel = traces.querySelector(".selected"); if (sel) sel.classList.remove("selected");
  row.classList.add("selected"); details(byId[row.dataset.id]);
});
document.getElementById("summary").addEventListener("click", function(e){
  var id = e.target.dataset && e.target.dataset.goto; if (!id) return;
  var row = document.getElementById("row-"+id); if (row) row.click();
});
document.body.dataset.renderMs = (performance.now()-t0).toFixed(1);
document.body.dataset.rendered = "1";
})();
"""


def _as_text_if_not_finite(value: object) -> object:
    """``value`` with each NaN and infinity as the text protobuf's JSON mapping (and
    so an OTLP-JSON file) writes: ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (JSON has
    no such numbers: ``JSON.parse`` refuses the whole document)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _as_text_if_not_finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_text_if_not_finite(v) for v in value]
    return value


def _inline_json(value: object) -> str:
    """JSON that is safe inside a ``<script>`` element (NaN and infinities as text)."""
    try:
        text = json.dumps(value, separators=(",", ":"), default=str, allow_nan=False)
    except ValueError:  # (a NaN or an infinity somewhere: only then walked)
        text = json.dumps(_as_text_if_not_finite(value), separators=(",", ":"),
                          default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(data: ReportData, title: str = "Dask spans report",
           profiles: Mapping[str, object] | None = None) -> str:
    """The report's whole HTML page for :func:`~dask_otel_spans.reports.model.build`'s
    data, with the flame graphs of ``profiles`` (:func:`~dask_otel_spans.reports.
    flames.flame_trees`)."""
    colours = activity_colours(data)
    flames = "" if not profiles else (
        f"<style>{STYLE}</style><script type=\"application/json\" id=\"report-profiles\">"
        f"{_inline_json(profiles)}</script><script>{SCRIPT}</script>")
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
        f"<header><h1>{html.escape(title)}</h1><div id=\"summary\"></div>"
        "<div class=\"legend\" id=\"legend\"></div></header>"
        "<main><div id=\"traces\"></div><aside id=\"details\">Select a span to see its "
        "attributes and, when it erred, its exception.</aside></main>"
        f"<script type=\"application/json\" id=\"report-data\">{_inline_json(data)}</script>"
        f"<script type=\"application/json\" id=\"report-colours\">{_inline_json(colours)}"
        f"</script><script>{_SCRIPT}</script>{flames}</body></html>"
    )


def render_fragment(data: ReportData,
                    profiles: Mapping[str, object] | None = None) -> str:
    """The report for a notebook cell: the page in a sandboxed ``iframe`` (its script
    and styles stay its own)."""
    page = html.escape(render(data, profiles=profiles), quote=True)
    return (f'<iframe srcdoc="{page}" sandbox="allow-scripts" '
            'style="width:100%;height:600px;border:1px solid #ddd"></iframe>')
