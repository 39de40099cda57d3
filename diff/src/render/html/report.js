// Opens a row's panel (per-position strip, inputs, details) from the JSON
// block, on a click on anything carrying data-row. `#row=NAME` in the URL
// clicks that row's heatmap cell once the page has loaded.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("taptree-data").textContent);
  var panel = document.getElementById("panel");
  if (!panel) return;
  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function num(x) {
    return x === null ? "not finite" : x === 0 ? "0" : x.toExponential(2);
  }
  function color(x) {
    if (x === null || x >= 1e-1) return "#b71c1c";
    if (x >= 1e-2) return "#e53935";
    if (x >= 1e-3) return "#ff8a65";
    if (x >= 1e-4) return "#ffe0b2";
    if (x >= 1e-6) return "#c8e6c9";
    if (x > 0) return "#a5d6a7";
    return "#e8f5e9";
  }
  function positions(r) {
    var out = [], fail = {}, i;
    (r.f || []).forEach(function (k) { fail[k] = 1; });
    for (i = 0; i < r.p.length; i++)
      out.push({ pos: r.p[i], slot: r.s ? r.s[i] : null, y: r.y[i], fail: !!fail[i] });
    (r.e || []).forEach(function (e) {
      for (var p = e[0]; p < e[1]; p++) out.push({ pos: p, slot: e[2], y: 0, fail: false, equal: true });
    });
    out.sort(function (a, b) { return (a.slot || 0) - (b.slot || 0) || a.pos - b.pos; });
    return out;
  }
  // One bar per position, height log-scaled, the prompt/decode border drawn.
  function strip(r) {
    var ps = positions(r), n = ps.length, toks = r.t || D.tokens;
    if (!n) return "<p class=\"dim\">no positions</p>";
    var bw = Math.max(3, Math.min(22, Math.floor(900 / n))), hgt = 70, labels = n <= 64 && toks.length;
    var w = bw * n + 2, h = hgt + (labels ? 60 : 16), s = "";
    ps.forEach(function (p, i) {
      var d = p.y === null ? 0 : p.y <= 0 ? -9 : Math.log10(p.y);
      var bh = p.y === null ? hgt : Math.max(2, Math.min(hgt, (d + 9) / 9 * hgt));
      var tok = toks[p.pos], slot = p.slot === null || p.slot === undefined ? "" : " slot " + p.slot;
      var phase = D.prompt === null ? "" : p.pos < D.prompt ? " prefill" : " decode";
      s += "<rect x=\"" + (i * bw + 1) + "\" y=\"" + (hgt - bh) + "\" width=\"" + (bw - 1) + "\" height=\"" + bh +
        "\" fill=\"" + color(p.y) + "\"" + (p.fail ? " stroke=\"#000\" stroke-width=\"1\"" : "") +
        " class=\"pos" + (p.fail ? " fail" : "") + "\" data-pos=\"" + p.pos + "\"><title>@" + p.pos + slot + phase +
        (tok !== undefined ? " " + esc(JSON.stringify(tok)) : "") + ": " + num(p.y) + (p.fail ? " FAIL" : "") +
        (p.equal ? " (equal by hash)" : "") + "</title></rect>";
      if (labels && tok !== undefined)
        s += "<text x=\"" + (i * bw + bw / 2) + "\" y=\"" + (hgt + 4) + "\" font-size=\"10\" transform=\"rotate(60 " +
          (i * bw + bw / 2) + " " + (hgt + 4) + ")\">" + esc(tok.length > 10 ? tok.slice(0, 10) + "…" : tok) + "</text>";
      if (D.prompt !== null && p.pos === D.prompt && i > 0)
        s += "<line x1=\"" + (i * bw) + "\" x2=\"" + (i * bw) + "\" y1=\"0\" y2=\"" + (hgt + 10) +
          "\" stroke=\"#1565c0\" stroke-width=\"2\"/><text x=\"" + (i * bw + 3) + "\" y=\"10\" font-size=\"10\" fill=\"#1565c0\">decode →</text>";
    });
    return "<svg class=\"strip\" width=\"" + w + "\" height=\"" + h + "\">" + s + "</svg>" +
      "<p class=\"dim\">" + n + " positions" + (D.prompt !== null ? ", prompt (prefill) @0.." + D.prompt + ", then decode" : "") +
      "; bar height: " + esc(D.value) + ", log scale; outlined: out of tolerance</p>";
  }
  function show(i) {
    var r = D.rows[i];
    if (!r) return;
    var h = "<h3 id=\"panel-title\">" + esc(r.n) + " <span class=\"" + (r.v === "FAIL" || r.v === "MISMATCH" ? "red" : "ok") +
      "\">" + esc(r.v) + "</span></h3><p>" + esc(D.value) + ": <b>" + num(r.x) + "</b></p>" + strip(r);
    if (r.i && r.i.length) {
      h += "<h4>Inputs</h4><table class=\"inputs\">";
      r.i.forEach(function (k) {
        var q = D.rows[k];
        h += "<tr><td><a data-row=\"" + k + "\">" + esc(q.n) + "</a></td><td>" + esc(q.v) + "</td><td>" + num(q.x) + "</td></tr>";
      });
      h += "</table>";
    } else {
      h += "<h4>Inputs</h4><p class=\"dim\">none in the stage graph</p>";
    }
    (r.d || []).forEach(function (d) {
      h += "<h4>" + esc(d[0]) + "</h4><pre>" + d[1].map(esc).join("\n") + "</pre>";
    });
    panel.innerHTML = h;
    panel.hidden = false;
    var old = document.querySelectorAll(".heat td.sel");
    for (var k = 0; k < old.length; k++) old[k].classList.remove("sel");
    var cell = document.querySelector(".heat td[data-row=\"" + i + "\"]");
    if (cell) cell.classList.add("sel");
  }
  document.addEventListener("click", function (e) {
    var t = e.target.closest ? e.target.closest("[data-row]") : null;
    if (!t) return;
    e.preventDefault();
    show(+t.getAttribute("data-row"));
    panel.scrollIntoView({ block: "nearest" });
  });
  var m = /^#row=(.+)$/.exec(location.hash);
  if (m) {
    var name = decodeURIComponent(m[1]);
    var cells = document.querySelectorAll(".heat td[data-name]");
    for (var k = 0; k < cells.length; k++) if (cells[k].getAttribute("data-name") === name) { cells[k].click(); break; }
  }
})();
