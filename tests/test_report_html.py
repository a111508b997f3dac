"""The HTML page of a campaign report (``sweeps.report_html.write_html``).

Built from copies of the real report folders in ``results/campaigns/`` and checked against
``REPORT.md`` and the PNG files themselves, parsed with the standard library's ``HTMLParser``:
nothing fetched from the network, every plot embedded byte for byte, one ``<h2>`` with an id and
a contents link per ``##`` heading, one ``<table>`` per Markdown table, balanced tags.
"""
from __future__ import annotations

import base64
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from sweeps.report_html import write_html

ROOT = Path(__file__).resolve().parent.parent
CAMPAIGNS = ROOT / "results" / "campaigns"
FOLDERS = sorted(p.name for p in CAMPAIGNS.iterdir() if (p / "REPORT.md").is_file())
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

#: ![caption](file) in Markdown
IMAGE_LINK = re.compile(r"!\[[^\]]*\]\(\s*([^)\s]+)\s*\)")
#: a pipe table's header separator line: |---|---| (optionally with alignment colons)
TABLE_SEP = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$")


class Page(HTMLParser):
    """Images, headings, contents links, tables, scripts and tag balance of a page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.imgs, self.h2, self.toc_links, self.tables, self.scripts, self.links = [], [], [], 0, [], []
        self.cells = []  # (tag, class, text)
        self.stack, self.errors = [], []
        self._h2 = self._cell = None
        self._nav = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in VOID:
            self.stack.append(tag)
        if tag == "img":
            self.imgs.append(a.get("src") or "")
        elif tag == "h2":
            self._h2 = [a.get("id"), ""]
        elif tag == "nav":
            self._nav += 1
        elif tag == "a" and self._nav and (a.get("href") or "").startswith("#"):
            self.toc_links.append(a["href"][1:])
        elif tag == "table":
            self.tables += 1
        elif tag == "script":
            self.scripts.append(a)
        elif tag == "link":
            self.links.append(a)
        elif tag in ("td", "th"):
            self._cell = [tag, a.get("class") or "", ""]

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()
        if tag == "h2" and self._h2 is not None:
            self.h2.append((self._h2[0], self._h2[1].strip()))
            self._h2 = None
        elif tag == "nav":
            self._nav -= 1
        elif tag in ("td", "th") and self._cell is not None:
            self.cells.append((self._cell[0], self._cell[1], self._cell[2].strip()))
            self._cell = None

    def handle_data(self, data):
        if self._h2 is not None:
            self._h2[1] += data
        if self._cell is not None:
            self._cell[2] += data


@pytest.fixture(params=FOLDERS)
def built(request, tmp_path):
    """(folder copy, path returned by write_html, page text, parsed page) for one real report folder."""
    d = tmp_path / request.param
    shutil.copytree(CAMPAIGNS / request.param, d, ignore=shutil.ignore_patterns("REPORT.html"))
    out = write_html(d)
    text = Path(out).read_text(encoding="utf-8")
    page = Page()
    page.feed(text)
    page.close()
    return d, out, text, page


def test_real_folders_present():
    assert "campaign_dpsgd" in FOLDERS


def test_written_atomically_beside_the_report(built):
    d, out, text, page = built
    assert Path(out) == d / "REPORT.html"
    assert Path(out).is_file()
    assert not (d / "REPORT.html.tmp").exists()
    assert text.lstrip().lower().startswith("<!doctype html>")


def test_self_contained(built):
    d, out, text, page = built
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)
    assert not page.links, "no external stylesheets"
    assert all("src" not in a for a in page.scripts), "no external scripts"
    assert not re.search(r"@import|url\(\s*['\"]?\s*(https?:)?//", text, re.I)
    # no file name of the folder is referenced outside a data URI
    rest = re.sub(r"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]*", "", text)
    assert ".png" not in rest.lower()
    for f in d.iterdir():
        if f.suffix == ".png":
            assert f.name not in rest


def test_every_plot_embedded_byte_for_byte(built):
    d, out, text, page = built
    links = IMAGE_LINK.findall((d / "REPORT.md").read_text())
    assert links, "the real reports link plots"
    assert len(page.imgs) == len(links)
    prefix = "data:image/png;base64,"
    for src, name in zip(page.imgs, links):
        assert src.startswith(prefix), src[:60]
        assert base64.b64decode(src[len(prefix):], validate=True) == (d / name).read_bytes(), name


def test_headings_with_ids_and_contents_links(built):
    d, out, text, page = built
    heads = [re.sub(r"[`*]", "", m).strip()
             for m in re.findall(r"^## (.+?)\s*#*\s*$", (d / "REPORT.md").read_text(), re.M)]
    assert heads
    assert [t for _, t in page.h2] == heads
    ids = [i for i, _ in page.h2]
    assert all(ids) and len(set(ids)) == len(ids)
    for hid in ids:
        assert hid in page.toc_links, hid
        assert len(re.findall(rf'\bid="{re.escape(hid)}"', text)) == 1


def test_one_table_per_markdown_table(built):
    d, out, text, page = built
    n = sum(1 for ln in (d / "REPORT.md").read_text().splitlines() if TABLE_SEP.match(ln))
    assert n
    assert page.tables == n


def test_parses_with_balanced_tags(built):
    d, out, text, page = built
    assert page.errors == []
    assert page.stack == []


def test_numbers_right_aligned(tmp_path):
    shutil.copytree(CAMPAIGNS / "campaign_dpsgd", tmp_path / "r", ignore=shutil.ignore_patterns("REPORT.html"))
    page = Page()
    page.feed(Path(write_html(tmp_path / "r")).read_text())
    by_text = {}
    for tag, cls, t in page.cells:
        if tag == "td":
            by_text.setdefault(t, set()).add("num" in cls.split())
    # numbers, percentages and exponents: right-aligned; words and code: not
    for t in ("288", "0.273%", "1.04e+03%", "0.0348"):
        assert by_text[t] == {True}, t
    for t in ("certified", "pld", "peer"):
        assert by_text[t] == {False}, t


def test_title_argument_escaped(tmp_path):
    shutil.copytree(CAMPAIGNS / "campaign_dpsgd", tmp_path / "r", ignore=shutil.ignore_patterns("REPORT.html"))
    text = Path(write_html(tmp_path / "r", title="A <b> & c")).read_text()
    assert "<title>A &lt;b&gt; &amp; c</title>" in text
    assert "<h1>A &lt;b&gt; &amp; c</h1>" in text


def test_missing_report(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "REPORT.md"))):
        write_html(tmp_path)
    assert not (tmp_path / "REPORT.html").exists()


def test_missing_plot_named(tmp_path):
    d = tmp_path / "r"
    shutil.copytree(CAMPAIGNS / "campaign_dpsgd", d, ignore=shutil.ignore_patterns("REPORT.html"))
    (d / "overshoot.png").unlink()
    with pytest.raises(FileNotFoundError, match="overshoot.png"):
        write_html(d)
    assert not (d / "REPORT.html").exists()


def test_links_to_other_sites_become_text(tmp_path):
    (tmp_path / "REPORT.md").write_text("# T\n\nSee [the paper](https://example.org/p) and [below](#s).\n\n## S\n")
    text = Path(write_html(tmp_path)).read_text()
    assert not re.search(r"""href\s*=\s*["']?https?:""", text, re.I)
    assert "the paper (https://example.org/p)" in text
    assert '<a href="#s">below</a>' in text


def test_remote_image_refused(tmp_path):
    (tmp_path / "REPORT.md").write_text("# T\n\n![x](https://example.org/x.png)\n")
    with pytest.raises(ValueError, match="example.org"):
        write_html(tmp_path)
