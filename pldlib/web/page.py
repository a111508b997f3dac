"""The calculator page: one HTML file with its CSS and JavaScript inline.

``page_html(mode="server")`` talks to :mod:`pldlib.web.app`'s JSON API; ``mode="static"``
answers atlas look-ups in the browser from ``atlas_slice.js`` (written beside it by
:func:`pldlib.web.export.export`) and needs no server.
"""
from __future__ import annotations

import html

TITLE = "pldlib: certified privacy calculator"


def page_html(mode: str = "server") -> str:
    if mode not in ("server", "static"):
        raise ValueError(f"mode: 'server' or 'static', got {mode!r}")
    script = '<script src="atlas_slice.js"></script>' if mode == "static" else ""
    return (_PAGE.replace("@@TITLE@@", html.escape(TITLE)).replace("@@MODE@@", mode)
            .replace("@@ATLAS_SCRIPT@@", script))


_PAGE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@@TITLE@@</title>
<style>
  body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1b1f24; background: #f6f7f9; }
  header { background: #23395d; color: #fff; padding: 14px 24px; }
  header h1 { font-size: 20px; margin: 0; }
  header p { margin: 4px 0 0; font-size: 13px; opacity: .85; }
  main { display: flex; gap: 20px; padding: 20px 24px; flex-wrap: wrap; }
  form, .results { background: #fff; border: 1px solid #d8dde3; border-radius: 8px; padding: 16px; }
  form { width: 330px; flex: none; }
  .results { flex: 1; min-width: 420px; }
  fieldset { border: none; padding: 0; margin: 0 0 10px; }
  legend { font-weight: 600; font-size: 13px; color: #475569; margin-bottom: 4px; }
  label { display: grid; grid-template-columns: 130px 1fr; align-items: center; font-size: 14px; margin: 4px 0; }
  input, select { font: inherit; padding: 3px 6px; border: 1px solid #b8c0ca; border-radius: 4px; min-width: 0; }
  input.bad { border-color: #c62828; background: #fff3f3; }
  .or { font-size: 12px; color: #64748b; margin: 2px 0 2px 130px; }
  button { font: inherit; padding: 6px 16px; border-radius: 5px; border: 1px solid #23395d; cursor: pointer; }
  #compute { background: #23395d; color: #fff; }
  #cancel { background: #fff; color: #23395d; }
  button:disabled { opacity: .45; cursor: default; }
  #error { color: #b71c1c; font-family: ui-monospace, monospace; font-size: 13px; min-height: 1.2em; margin-top: 8px; white-space: pre-wrap; }
  .card { border: 1px solid #e2e6ea; border-radius: 6px; padding: 10px 12px; margin-bottom: 12px; }
  .card h2 { font-size: 15px; margin: 0 0 6px; }
  .big { font-size: 22px; font-weight: 600; font-variant-numeric: tabular-nums; }
  .badge { display: inline-block; font-size: 11px; padding: 1px 7px; border-radius: 9px; margin-left: 6px; vertical-align: middle; }
  .certified { background: #e0f2e9; color: #14532d; border: 1px solid #86c6a4; }
  .estimate { background: #eef0f3; color: #475569; border: 1px solid #c3c9d1; }
  .muted { color: #64748b; font-size: 13px; }
  #status { font-size: 13px; color: #334155; min-height: 1.2em; }
  .bar { height: 4px; background: #e2e6ea; border-radius: 2px; overflow: hidden; margin: 4px 0 8px; }
  .bar div { height: 100%; width: 0; background: #23395d; transition: width .2s; }
  table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
  td, th { border: 1px solid #d8dde3; padding: 3px 8px; text-align: right; }
  th { background: #f1f4f7; }
  svg { background: #fff; }
  .charts { display: flex; gap: 14px; flex-wrap: wrap; }
  footer { padding: 0 24px 20px; font-size: 12px; color: #64748b; }
</style>
</head>
<body>
<header>
  <h1>@@TITLE@@</h1>
  <p>DP-SGD with the Gaussian mechanism: the noise multiplier for a target, or the privacy of a noise multiplier.
     Numbers marked <span class="badge certified">certified</span> carry a proof (upper or lower bound);
     <span class="badge estimate">estimate</span> numbers do not.</p>
</header>
<main>
<form id="form" onsubmit="return false" novalidate>
  <fieldset><legend>Sampling rate</legend>
    <label>dataset size <input id="dataset_size" value="60000" inputmode="numeric"></label>
    <label>batch size <input id="batch_size" value="600" inputmode="numeric"></label>
    <div class="or">or</div>
    <label>q <input id="q" placeholder="batch / dataset size"></label>
  </fieldset>
  <fieldset><legend>Length of training</legend>
    <label>epochs <input id="epochs" value="100"></label>
    <div class="or">or</div>
    <label>steps <input id="steps" placeholder="optimizer steps"></label>
  </fieldset>
  <fieldset><legend>Accounting</legend>
    <label>sampling <select id="sampling"><option value="poisson">Poisson</option>
      <option value="wor">without replacement (fixed batch)</option></select></label>
    <label>relation <select id="relation"><option value="add_remove">add or remove</option>
      <option value="add">add</option><option value="remove">remove</option>
      <option value="substitution">substitution</option></select></label>
    <label>delta <input id="delta" value="1e-5"></label>
  </fieldset>
  <fieldset><legend>Target (one of)</legend>
    <label>epsilon <input id="epsilon" value="6"></label>
    <div class="or">or</div>
    <label>noise multiplier <input id="sigma" placeholder="sigma"></label>
    <label>FPRs for TPR <input id="fprs" value="0.001, 0.01, 0.1"></label>
  </fieldset>
  <button id="compute" type="button">Compute</button>
  <button id="cancel" type="button" disabled>Cancel</button>
  <div id="error" role="alert"></div>
</form>
<section class="results">
  <div class="card" id="atlas-card"><h2>From the atlas <span class="badge certified">certified</span></h2>
    <div class="big" id="atlas-sigma" data-value="">&ndash;</div>
    <div class="muted" id="atlas-note">A certified noise multiplier read from the precomputed atlas (instant; coarser than the exact one).</div>
  </div>
  <div class="card" id="exact-card"><h2>Exact, by the PLD accountant <span class="badge certified">certified</span></h2>
    <div id="status"></div><div class="bar"><div id="bar"></div></div>
    <div class="big" id="exact-sigma" data-value="">&ndash;</div>
    <div id="exact-eps" data-lower="" data-upper=""></div>
    <div class="muted" id="exact-note"></div>
  </div>
  <div class="charts">
    <div class="card"><h2>Epsilon over training <span class="badge certified">certified band</span></h2><svg id="band" width="420" height="260"></svg></div>
    <div class="card"><h2>Trade-off curve <span class="badge certified">certified band</span></h2><svg id="curve" width="300" height="260"></svg></div>
  </div>
  <div class="card"><h2>Membership-inference bounds <span class="badge certified">certified</span></h2>
    <div class="muted">Largest true-positive rate of any membership test at each false-positive rate.</div>
    <table id="tpr"><thead><tr><th>FPR</th><th>TPR lower</th><th>TPR upper</th></tr></thead><tbody></tbody></table>
  </div>
</section>
</main>
<footer>pldlib &middot; mode: <span id="mode">@@MODE@@</span></footer>
@@ATLAS_SCRIPT@@
<script>
"use strict";
const MODE = "@@MODE@@";
const FIELDS = ["dataset_size", "batch_size", "q", "epochs", "steps", "sampling", "relation", "delta", "epsilon", "sigma", "fprs"];
let job = null, timer = null, startedAt = 0;
const $ = (id) => document.getElementById(id);
const fmt = (x, d = 6) => x === null || x === undefined ? "\u2013" : (typeof x === "string" ? x : Number(x).toPrecision(d));

function form() { const f = {}; for (const k of FIELDS) f[k] = $(k).value.trim(); return f; }
function setError(msg, field) {
  $("error").textContent = msg || "";
  for (const k of FIELDS) $(k).classList.toggle("bad", !!msg && k === field);
}
function clearResults() {
  for (const id of ["atlas-sigma", "exact-sigma"]) { $(id).textContent = "\u2013"; $(id).dataset.value = ""; }
  $("exact-eps").textContent = ""; $("exact-note").textContent = ""; $("status").textContent = "";
  $("bar").style.width = "0"; $("band").innerHTML = ""; $("curve").innerHTML = "";
  document.querySelector("#tpr tbody").innerHTML = "";
}
function showAtlas(a) {
  if (a.sigma !== null && a.sigma !== undefined) {
    $("atlas-sigma").textContent = "sigma \u2264 " + fmt(a.sigma, 5);
    $("atlas-sigma").dataset.value = String(a.sigma);
    $("atlas-note").textContent = "certified: this sigma meets the target" +
      (a.estimate ? "; interpolated estimate " + fmt(a.estimate, 4) + " (estimate, no guarantee)" : "");
  } else {
    $("atlas-sigma").textContent = "\u2013";
    $("atlas-note").textContent = a.note || "no atlas answer";
  }
}
function showExact(r) {
  const eps = r.epsilon;
  if (r.calibration) {
    $("exact-sigma").textContent = "sigma = " + fmt(r.calibration.sigma, 6);
    $("exact-sigma").dataset.value = String(r.calibration.sigma);
    $("exact-note").textContent = "the smallest sigma found whose certified epsilon meets the target" +
      (r.calibration.sigma_lower ? "; sigma " + fmt(r.calibration.sigma_lower, 6) + " is certified NOT to meet it" : "");
  } else {
    $("exact-sigma").textContent = "sigma = " + fmt(r.sigma, 6);
    $("exact-sigma").dataset.value = String(r.sigma);
  }
  $("exact-eps").textContent = "epsilon(" + Number(r.query.delta).toExponential() + ") \u2208 [" + fmt(eps.lower, 6) + ", " + fmt(eps.upper, 6) + "]" +
    " after " + r.query.steps.toLocaleString() + " steps (q = " + fmt(r.query.q, 4) + ")" + (eps.accuracy_limited ? " (accuracy limited)" : "");
  $("exact-eps").dataset.lower = String(eps.lower); $("exact-eps").dataset.upper = String(eps.upper);
  plotBand($("band"), r.band.steps, r.band.lower, r.band.upper, {logx: true, xlabel: "steps", ylabel: "epsilon"});
  plotBand($("curve"), r.tradeoff.alpha, r.tradeoff.beta_lower, r.tradeoff.beta_upper, {xlabel: "FPR (alpha)", ylabel: "FNR (beta)", diag: true, unit: true});
  const body = document.querySelector("#tpr tbody");
  body.innerHTML = "";
  r.tpr.fpr.forEach((f, i) => {
    const tr = document.createElement("tr");
    [String(f), fmt(r.tpr.lower[i], 5), fmt(r.tpr.upper[i], 5)].forEach(v => { const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); });
    body.appendChild(tr);
  });
}
function plotBand(svg, xs, lo, up, o) {
  const W = +svg.getAttribute("width"), H = +svg.getAttribute("height"), L = 52, R = 20, T = 10, B = 36;
  const num = (v) => v === "inf" ? Infinity : (v === "-inf" ? -Infinity : v);
  const pts = xs.map((x, i) => [x, num(lo[i]), num(up[i])]).filter(p => (!o.logx || p[0] > 0) && isFinite(p[2]));
  if (!pts.length) { svg.innerHTML = ""; return; }
  const fx = o.logx ? Math.log10 : (v) => v;
  const x0 = fx(Math.min(...pts.map(p => p[0]))), x1 = fx(Math.max(...pts.map(p => p[0])));
  const y0 = o.unit ? 0 : Math.min(0, ...pts.map(p => isFinite(p[1]) ? p[1] : 0)), y1 = o.unit ? 1 : Math.max(...pts.map(p => p[2])) * 1.05 || 1;
  const sx = (v) => L + (fx(v) - x0) / ((x1 - x0) || 1) * (W - L - R), sy = (v) => T + (1 - (v - y0) / ((y1 - y0) || 1)) * (H - T - B);
  const clampLo = (v) => isFinite(v) ? Math.max(v, y0) : y0;
  let path = pts.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(p[2]).toFixed(1)).join("");
  path += pts.slice().reverse().map(p => "L" + sx(p[0]).toFixed(1) + "," + sy(clampLo(p[1])).toFixed(1)).join("") + "Z";
  const line = (k) => pts.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(k === 1 ? clampLo(p[1]) : p[2]).toFixed(1)).join("");
  let g = `<rect x="${L}" y="${T}" width="${W - L - R}" height="${H - T - B}" fill="none" stroke="#ccd3db"/>`;
  g += `<path d="${path}" fill="#23395d" fill-opacity="0.18"/>`;
  g += `<path d="${line(2)}" fill="none" stroke="#23395d" stroke-width="1.6"/><path d="${line(1)}" fill="none" stroke="#23395d" stroke-dasharray="4 3"/>`;
  if (o.diag) g += `<path d="M${sx(0)},${sy(1)}L${sx(1)},${sy(0)}" stroke="#9aa5b1" stroke-dasharray="2 3"/>`;
  const ticks = (a, b, log) => { const out = []; if (log) { for (let e = Math.ceil(a); e <= Math.floor(b); e++) out.push(Math.pow(10, e)); } else { for (let i = 0; i <= 4; i++) out.push(a + (b - a) * i / 4); } return out; };
  for (const t of ticks(x0, x1, o.logx)) g += `<text x="${sx(t)}" y="${H - B + 14}" font-size="10" text-anchor="middle">${o.logx ? (t >= 1000 ? t.toExponential(0) : t) : t.toPrecision(2)}</text>`;
  for (const t of ticks(y0, y1, false)) g += `<text x="${L - 4}" y="${sy(t) + 3}" font-size="10" text-anchor="end">${t.toPrecision(3)}</text>`;
  g += `<text x="${(L + W - R) / 2}" y="${H - 4}" font-size="11" text-anchor="middle">${o.xlabel}</text>`;
  g += `<text x="12" y="${(T + H - B) / 2}" font-size="11" text-anchor="middle" transform="rotate(-90 12 ${(T + H - B) / 2})">${o.ylabel}</text>`;
  g += `<text x="${W - R - 4}" y="${T + 12}" font-size="10" text-anchor="end">upper solid, lower dashed</text>`;
  svg.innerHTML = g;
}
async function post(url, body) {
  const r = await fetch(url, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
  return [r.status, await r.json()];
}
function busy(on) { $("compute").disabled = on; $("cancel").disabled = !on; }
async function poll() {
  if (!job) return;
  const r = await fetch("/api/jobs/" + job);
  const j = await r.json();
  const n = j.stages.length;
  $("status").textContent = (j.state === "running" || j.state === "queued") ? (j.stages[n - 1] || "starting") + " \u2026 (" + j.seconds.toFixed(1) + " s)" : "";
  $("bar").style.width = Math.min(100, 100 * n / 5) + "%";
  if (j.state === "done") { $("bar").style.width = "100%"; $("status").textContent = "done in " + j.seconds.toFixed(2) + " s"; showExact(j.result); job = null; busy(false); document.body.dataset.exact = "done"; return; }
  if (j.state === "error") { setError(j.error); $("status").textContent = "failed"; job = null; busy(false); document.body.dataset.exact = "error"; return; }
  if (j.state === "cancelled") { $("status").textContent = "cancelled"; job = null; busy(false); document.body.dataset.exact = "cancelled"; return; }
  timer = setTimeout(poll, 150);
}
async function computeServer(f) {
  const [s, a] = await post("/api/atlas", f);
  if (s !== 200) { setError(a.error, a.field); busy(false); document.body.dataset.exact = "invalid"; return; }
  showAtlas(a.atlas); document.body.dataset.atlas = "done";
  const [s2, j] = await post("/api/jobs", f);
  if (s2 !== 201) { setError(j.error, j.field); busy(false); return; }
  job = j.id; poll();
}
// -- the static page: atlas look-ups in the browser ------------------------------------------------
function pyNum(x) { const s = String(x); return /^-?\d+$/.test(s) ? s + ".0" : s; }
function check(field, flag, text, kind) {
  const bad = (why) => { throw {field: field, error: "argument --" + flag + ": " + why}; };
  if (text === "") bad("required");
  const x = Number(text);
  if (!isFinite(x) && !/^[-+]?inf/i.test(text)) bad("invalid number: " + JSON.stringify(text));
  if (kind === "count" && !(x >= 1 && Math.floor(x) === x)) bad("must be an integer >= 1, got " + pyNum(x));
  if (kind === "open" && !(x > 0 && x < 1)) bad("must be in (0, 1), got " + pyNum(x));
  if (kind === "q" && !(x > 0 && x <= 1)) bad("must be in (0, 1], got " + pyNum(x));
  if (kind === "positive" && !(x > 0 && isFinite(x))) bad((isFinite(x) ? "must be > 0, got " : "must be finite, got ") + pyNum(x));
  return x;
}
function staticQuery(f) {
  let q;
  if (f.dataset_size || f.batch_size) {
    const n = check("dataset_size", "dataset-size", f.dataset_size, "count"), b = check("batch_size", "batch-size", f.batch_size, "count");
    if (b > n) throw {field: "batch_size", error: "argument --batch-size: must be at most the dataset size " + n + ", got " + b};
    q = b / n;
  } else q = check("q", "q", f.q, "q");
  let steps;
  if (f.epochs) steps = Math.max(1, Math.ceil(check("epochs", "epochs", f.epochs, "positive") / q - 1e-9));
  else steps = check("steps", "steps", f.steps, "count");
  const delta = check("delta", "delta", f.delta, "open");
  if (!f.epsilon) throw {field: "epsilon", error: "the static page answers a target epsilon from the atlas; run `pldlib serve` for a given sigma"};
  const eps = check("epsilon", "epsilon", f.epsilon, "positive");
  return {q, steps, delta, epsilon: eps, sampling: f.sampling, relation: f.relation};
}
// (exact comparisons: a cell a rounding error on the wrong side of the query would not be certified for it)
function firstAtLeast(axis, x) { for (let i = 0; i < axis.length; i++) if (axis[i] >= x) return i; return -1; }
function lastAtMost(axis, x) { for (let i = axis.length - 1; i >= 0; i--) if (axis[i] <= x) return i; return -1; }
function staticLookup(Q) {
  const A = window.PLDLIB_ATLAS;
  const t = A.tables[Q.sampling + "/" + Q.relation];
  if (!t) return {sigma: null, note: "outside the atlas: it covers " + Object.keys(A.tables).join(", ")};
  const iq = firstAtLeast(t.q, Q.q), ik = firstAtLeast(A.steps, Q.steps), id = lastAtMost(A.delta, Q.delta), ie = lastAtMost(A.epsilon, Q.epsilon);
  if (iq < 0 || ik < 0 || id < 0 || ie < 0)
    return {sigma: null, note: "outside the atlas slice: q \u2264 " + t.q[t.q.length - 1] + ", steps \u2264 " + A.steps[A.steps.length - 1] +
      ", delta \u2265 " + A.delta[0] + ", epsilon \u2265 " + A.epsilon[0]};
  const s = t.sigma[((iq * A.steps.length + ik) * A.delta.length + id) * A.epsilon.length + ie];
  if (!(s > 0)) return {sigma: null, note: "no sigma in the atlas meets this target"};
  return {sigma: s, note: null, cell: {q: t.q[iq], steps: A.steps[ik], delta: A.delta[id], epsilon: A.epsilon[ie]}};
}
function computeStatic(f) {
  let Q;
  try { Q = staticQuery(f); } catch (e) { setError(e.error, e.field); busy(false); document.body.dataset.atlas = "invalid"; return; }
  const a = staticLookup(Q);
  showAtlas(a);
  if (a.cell) $("atlas-note").textContent = "certified at the atlas cell q = " + a.cell.q + ", steps = " + a.cell.steps +
    ", delta = " + a.cell.delta + ", epsilon = " + a.cell.epsilon + " (each on the safe side of the query)";
  $("status").textContent = "exact answers need the server: pldlib serve";
  busy(false); document.body.dataset.atlas = "done";
}
$("compute").addEventListener("click", () => {
  setError(""); clearResults(); delete document.body.dataset.atlas; delete document.body.dataset.exact;
  busy(true); startedAt = performance.now();
  const f = form();
  if (MODE === "static") computeStatic(f); else computeServer(f).catch(e => { setError(String(e)); busy(false); });
});
$("cancel").addEventListener("click", async () => {
  if (!job) return;
  clearTimeout(timer);
  await fetch("/api/jobs/" + job, {method: "DELETE"});
  poll();
});
</script>
</body>
</html>
"""
