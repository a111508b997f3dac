"""A campaign report as one HTML page: ``python -m sweeps.report_html DIR``.

Reads ``DIR/REPORT.md`` (written by :func:`sweeps.campaign.write_report`), the
images it links and ``DIR/summary.json``, and writes ``DIR/REPORT.html``: one
self-contained file that opens from disk with no network.  CSS and a few
lines of JavaScript are inline, every image is embedded as a ``data:`` URI and
``summary.json`` is attached as a download link (also a ``data:`` URI).

The page has a table of contents built from the ``##`` headings (``###``
headings nested under them), tables with borders, zebra rows and numeric cells
right-aligned (click a column header to sort by it), and plots that open
full-size in an overlay when clicked (Esc or a click closes it).  Markdown is
rendered by ``markdown-it-py`` (CommonMark plus tables); links to other sites
become plain text with the address in brackets, so the page fetches nothing.
"""
from __future__ import annotations

import base64
import html
import json
import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

__all__ = ["write_html"]

#: image types that can be embedded, by file suffix
IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
               ".webp": "image/webp", ".svg": "image/svg+xml"}

#: a table cell that is a number: 12, -0.5, 1,234, 3.1e-05, 1.04e+03%, 0.273%
_NUMBER = re.compile(r"[-+]?(\d[\d,]*(\.\d*)?|\.\d+)([eE][-+]?\d+)?%?")
#: table cells that stand for "no number" and do not make a column non-numeric
_BLANK = {"", "-", "n/a", "nan", "NaN"}

_CSS = """
:root{--fg:#1d1f23;--muted:#5b6270;--line:#d0d4db;--zebra:#f4f6f9;--accent:#2357a6;--code:#eef0f4}
*{box-sizing:border-box}
body{margin:0;font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:#fff}
.page{display:flex;gap:2rem;max-width:1400px;margin:0 auto;padding:1.5rem}
nav.toc{flex:0 0 15rem;position:sticky;top:1rem;align-self:flex-start;max-height:calc(100vh - 2rem);overflow:auto;
 font-size:.9rem;border-right:1px solid var(--line);padding-right:1rem}
nav.toc ul{list-style:none;margin:0;padding-left:0}nav.toc ul ul{padding-left:1rem;font-size:.85rem}
nav.toc li{margin:.25rem 0}nav.toc a{color:var(--accent);text-decoration:none}nav.toc a:hover{text-decoration:underline}
main{flex:1;min-width:0}
h1{font-size:1.7rem;margin:.2rem 0 1rem}h2{margin-top:2.2rem;border-bottom:1px solid var(--line);padding-bottom:.2rem}
h2,h3{scroll-margin-top:1rem}
code{background:var(--code);padding:.05rem .3rem;border-radius:3px;font-size:.9em}
.tw{overflow-x:auto;margin:1rem 0}
table{border-collapse:collapse;font-size:.87rem}
th,td{border:1px solid var(--line);padding:.3rem .55rem;vertical-align:top}
th{background:#e7ebf1;text-align:left;cursor:pointer;user-select:none}
th[data-dir=asc]::after{content:" \\25B2"}th[data-dir=desc]::after{content:" \\25BC"}
tbody tr:nth-child(even){background:var(--zebra)}tbody tr:hover{background:#e3ecfa}
th.num,td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
img{max-width:100%;height:auto}
figure{margin:1.2rem 0;text-align:center}figure img{cursor:zoom-in;border:1px solid var(--line)}
figcaption{color:var(--muted);font-size:.9rem}
.meta{color:var(--muted);font-size:.85rem}
#overlay{position:fixed;inset:0;background:rgba(10,12,16,.88);overflow:auto;z-index:10;cursor:zoom-out;
 display:flex;align-items:flex-start;justify-content:center;padding:1rem}
#overlay[hidden]{display:none}#overlay img{max-width:none;background:#fff}
@media (max-width:900px){.page{display:block}nav.toc{position:static;border:0;max-height:none}}
@media print{nav.toc{display:none}}
"""

_JS = """
(function(){
var ov=document.createElement('div'),big=document.createElement('img');
ov.id='overlay';ov.hidden=true;ov.appendChild(big);document.body.appendChild(ov);
document.querySelectorAll('figure img').forEach(function(im){
 im.title='click to enlarge';
 im.addEventListener('click',function(){big.src=im.src;big.alt=im.alt;ov.hidden=false;});});
ov.addEventListener('click',function(){ov.hidden=true;});
document.addEventListener('keydown',function(e){if(e.key==='Escape')ov.hidden=true;});
function key(td){var t=td.textContent.trim(),x=parseFloat(t.replace(/,/g,''));
 return /^[-+]?(\\d|\\.\\d)/.test(t)&&!isNaN(x)?x:(t==='n/a'||t==='-'?null:t.toLowerCase());}
document.querySelectorAll('table').forEach(function(tb){
 var body=tb.tBodies[0];if(!body)return;
 tb.querySelectorAll('thead th').forEach(function(th,i){th.addEventListener('click',function(){
  var d=th.dataset.dir==='asc'?'desc':'asc',s=d==='asc'?1:-1;
  tb.querySelectorAll('thead th').forEach(function(h){delete h.dataset.dir;});th.dataset.dir=d;
  Array.from(body.rows).map(function(r){return [key(r.cells[i]||r),r];}).sort(function(a,b){
   if(a[0]===null)return b[0]===null?0:1;if(b[0]===null)return -1;
   if(typeof a[0]!==typeof b[0])return (typeof a[0]==='number'?-1:1)*s;
   return (a[0]<b[0]?-1:a[0]>b[0]?1:0)*s;}).forEach(function(p){body.appendChild(p[1]);});});});});
})();
"""


def _plain(inline) -> str:
    """The text of an inline token (code spans included, markup dropped)."""
    return "".join(c.content for c in (inline.children or []) if c.type in ("text", "code_inline", "html_inline"))


def _slug(text: str, used: set) -> str:
    """A unique HTML id for a heading."""
    base = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
    slug, k = base, 2
    while slug in used:
        slug, k = f"{base}-{k}", k + 1
    used.add(slug)
    return slug


def _data_uri(path: Path, mime: str) -> str:
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _is_external(url: str) -> bool:
    """A URL that names another site (the page must not fetch it)."""
    parts = urlsplit(url)
    return bool(parts.scheme and parts.scheme not in ("data", "file")) or url.startswith("//")


def _embed_images(tokens, out_dir: Path, Token) -> None:
    """Replace each image's file name by its data URI; a paragraph holding one image becomes a figure."""
    for i, tok in enumerate(tokens):
        if tok.type != "inline" or not tok.children:
            continue
        for child in tok.children:
            if child.type != "image":
                continue
            src = str(child.attrGet("src") or "")
            if _is_external(src):
                raise ValueError(f"{out_dir / 'REPORT.md'}: image {src!r} is not a local file; "
                                 "a self-contained page cannot link it")
            if src.startswith("data:"):
                continue
            path = out_dir / unquote(src.split("#")[0].split("?")[0])
            mime = IMAGE_TYPES.get(path.suffix.lower())
            if mime is None:
                raise ValueError(f"{path}: cannot embed images of type {path.suffix or '(none)'!r}")
            if not path.is_file():
                raise FileNotFoundError(f"{path}: image linked from REPORT.md not found")
            child.attrSet("src", _data_uri(path, mime))
        kids = [c for c in tok.children if not (c.type == "text" and not c.content.strip())]
        if (len(kids) == 1 and kids[0].type == "image" and 0 < i < len(tokens) - 1
                and tokens[i - 1].type == "paragraph_open" and tokens[i + 1].type == "paragraph_close"):
            tokens[i - 1].tag = tokens[i + 1].tag = "figure"
            caption = "".join(c.content for c in (kids[0].children or []))
            if caption:
                tok.children += [Token("figcaption_open", "figcaption", 1),
                                 Token("text", "", 0, content=caption),
                                 Token("figcaption_close", "figcaption", -1)]


def _unlink_external(tokens, Token) -> None:
    """Links to other sites become their text followed by the address in brackets."""
    for tok in tokens:
        if tok.type != "inline" or not tok.children:
            continue
        out, stack = [], []
        for c in tok.children:
            if c.type == "link_open":
                href = str(c.attrGet("href") or "")
                stack.append((href, len(out)) if _is_external(href) else None)
                if stack[-1] is None:
                    out.append(c)
            elif c.type == "link_close" and stack:
                top = stack.pop()
                if top is None:
                    out.append(c)
                elif "".join(t.content for t in out[top[1]:]).strip() not in (top[0], top[0].split(":", 1)[-1]):
                    out.append(Token("text", "", 0, content=f" ({top[0]})"))
            else:
                out.append(c)
        tok.children = out


def _number_cells(tokens) -> None:
    """Give numeric table cells (and the headers of all-numeric columns) the class ``num``."""
    i = 0
    while i < len(tokens):
        if tokens[i].type != "table_open":
            i += 1
            continue
        heads, cols = [], {}
        j, col = i + 1, 0
        while tokens[j].type != "table_close":
            t = tokens[j]
            if t.type == "tr_open":
                col = 0
            elif t.type in ("th_open", "td_open"):
                text = _plain(tokens[j + 1]).strip()
                if t.type == "th_open":
                    heads.append(t)
                else:
                    cols.setdefault(col, []).append((t, text))
                    if _NUMBER.fullmatch(text):
                        t.attrJoin("class", "num")
                col += 1
            j += 1
        for c, head in enumerate(heads):
            cells = cols.get(c, [])
            if any(_NUMBER.fullmatch(x) for _, x in cells) and all(
                    _NUMBER.fullmatch(x) or x in _BLANK for _, x in cells):
                head.attrJoin("class", "num")
                for t, x in cells:
                    if x in _BLANK:
                        t.attrJoin("class", "num")
        i = j + 1


def _wrap_tables(tokens, Token) -> list:
    """Each table inside ``<div class="tw">`` (scrolls sideways when wide)."""
    out = []
    for t in tokens:
        if t.type == "table_open":
            out.append(Token("html_block", "", 0, content='<div class="tw">\n'))
        out.append(t)
        if t.type == "table_close":
            out.append(Token("html_block", "", 0, content="</div>\n"))
    return out


def _headings(tokens, md) -> tuple[str | None, str | None, list]:
    """Ids on the ``##``/``###`` headings; removes the first ``#`` heading.

    Returns (its HTML, its text, [(level, id, html) of the ``##``/``###`` headings])."""
    used = {"toc", "overlay", "top"}
    title_html = title_text = None
    toc, drop = [], None
    for i, t in enumerate(tokens):
        if t.type != "heading_open":
            continue
        inline = tokens[i + 1]
        inner = md.renderer.renderInline(inline.children or [], md.options, {})
        if t.tag == "h1" and title_html is None:
            title_html, title_text, drop = inner, _plain(inline).strip(), i
        elif t.tag in ("h2", "h3"):
            hid = _slug(_plain(inline), used)
            t.attrSet("id", hid)
            toc.append((int(t.tag[1]), hid, inner))
    if drop is not None:
        del tokens[drop:drop + 3]
    return title_html, title_text, toc


def _toc_html(toc) -> str:
    """Nested list of links: ``##`` headings, their ``###`` headings below them."""
    out, open_sub = ['<nav class="toc" id="toc"><strong>Contents</strong>', "<ul>"], False
    for k, (level, hid, inner) in enumerate(toc):
        link = f'<a href="#{hid}">{inner}</a>'
        if level == 2:
            if k:
                out.append("</ul></li>" if open_sub else "</li>")
            open_sub = False
            out.append(f"<li>{link}")
        else:
            if not open_sub:
                out.append("<ul>")
                open_sub = True
            out.append(f"<li>{link}</li>")
    if toc:
        out.append("</ul></li>" if open_sub else "</li>")
    out += ["</ul>", "</nav>"]
    return "\n".join(out)


def _summary_html(out_dir: Path) -> str:
    """A line naming the store and a download link carrying summary.json (empty if there is none)."""
    path = out_dir / "summary.json"
    if not path.is_file():
        return ""
    parts = []
    try:
        s = json.loads(path.read_text())
    except ValueError:
        s = {}
    if isinstance(s, dict):
        if s.get("store"):
            parts.append(f"store <code>{html.escape(str(s['store']))}</code>")
        if s.get("fingerprint"):
            parts.append(f"fingerprint <code>{html.escape(str(s['fingerprint'])[:12])}</code>")
        if s.get("finished"):
            parts.append(f"finished {html.escape(str(s['finished']))}")
    parts.append(f'<a download="summary.json" href="{_data_uri(path, "application/json")}">'
                 "download summary.json</a> (the numbers of this report)")
    return '<p class="meta">' + "; ".join(parts) + ".</p>"


def write_html(out_dir, title: str | None = None) -> str:
    """Render ``out_dir/REPORT.md`` (with the images it links and ``summary.json``) as one self-contained
    page ``out_dir/REPORT.html``; returns its path.

    ``title``: the page's title (default: the report's ``#`` heading)."""
    try:
        from markdown_it import MarkdownIt
        from markdown_it.token import Token
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("write_html needs markdown-it-py (pip install markdown-it-py)") from e

    out_dir = Path(out_dir)
    src = out_dir / "REPORT.md"
    if not src.is_file():
        raise FileNotFoundError(f"{src}: no REPORT.md to render (write it with `sweeps report STORE --out DIR`)")
    md = MarkdownIt("commonmark").enable("table")
    tokens = md.parse(src.read_text(encoding="utf-8"))
    _embed_images(tokens, out_dir, Token)
    _unlink_external(tokens, Token)
    _number_cells(tokens)
    h1_html, h1_text, toc = _headings(tokens, md)
    tokens = _wrap_tables(tokens, Token)
    body = md.renderer.render(tokens, md.options, {})

    if title is not None:
        head_text, head_html = title, html.escape(title)
    elif h1_html is not None:
        head_text, head_html = h1_text, h1_html
    else:
        head_text = f"Report: {out_dir.resolve().name}"
        head_html = html.escape(head_text)
    page = "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(head_text)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        '<div class="page" id="top">',
        _toc_html(toc),
        "<main>",
        f"<h1>{head_html}</h1>",
        _summary_html(out_dir),
        body,
        "</main>",
        "</div>",
        f"<script>{_JS}</script>",
        "</body>",
        "</html>",
        "",
    ])
    path = out_dir / "REPORT.html"
    tmp = out_dir / "REPORT.html.tmp"
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, path)
    return str(path)


def main(argv=None) -> int:
    """``python -m sweeps.report_html DIR [--title TITLE]``: write DIR/REPORT.html, print its path."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m sweeps.report_html", description=main.__doc__)
    ap.add_argument("dir", help="a report folder (REPORT.md, its PNGs, summary.json)")
    ap.add_argument("--title", default=None, help="page title (default: the report's # heading)")
    a = ap.parse_args(argv)
    print(write_html(a.dir, a.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
