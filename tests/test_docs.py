"""The user guide: it builds without a warning, and every example in it runs.

* ``sphinx-build -W`` builds docs/ (Markdown pages through myst-parser, the API reference
  from the docstrings) into a temporary folder.
* Every ```python block of README.md and docs/*.md (not MATH.md) is executed; the blocks of
  one page share one namespace, in order, as a reader would run them.
* Every ```console / ```bash block whose commands start with ``pldlib`` or ``sweeps`` is run
  with this environment's entry points; where the block shows output, the output must match
  (``...`` stands for any text, runs of spaces for any run of spaces).
* The measured numbers the guide shows come from docs/gen_numbers.py (read from results/);
  no internal labels reach user-facing text; the README stays one screen.

Everything runs in a scratch folder whose ``configs`` and ``results`` point at the
repository's, so a page's examples never write into the repository.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BIN = Path(sys.executable).parent
PAGES = [ROOT / "README.md"] + sorted(p for p in DOCS.glob("*.md") if p.name != "MATH.md")
FENCE = re.compile(r"^```([\w{}-]*)[^\n]*\n(.*?)^```\s*$", re.M | re.S)
HAVE = {m: __import__("importlib").util.find_spec(m) is not None for m in ("opacus", "torch")}


def blocks(page: Path, langs: tuple[str, ...]) -> list[tuple[int, str, str]]:
    """(line number, language, code) of the page's fenced blocks in ``langs``."""
    text = page.read_text()
    out = []
    for m in FENCE.finditer(text):
        if m.group(1) in langs:
            out.append((text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)))
    return out


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A folder with ``configs`` -> the repository's and ``results/*`` -> the repository's
    results (stores excluded): examples read the shipped results and write only here."""
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "results").mkdir()
    for p in (ROOT / "results").iterdir():
        if not p.name.endswith(".zarr"):
            (tmp_path / "results" / p.name).symlink_to(p)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ---------------------------------------------------------------- the build

@pytest.mark.slow
def test_guide_builds_without_warnings(tmp_path):
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html",
                        str(DOCS), str(tmp_path / "html")], capture_output=True, text=True, timeout=300)
    print(f"sphinx-build: {time.perf_counter() - t0:.1f} s")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "html" / "index.html").exists() and (tmp_path / "html" / "api.html").exists()


def test_every_page_is_in_the_table_of_contents():
    index = (DOCS / "index.md").read_text()
    for page in PAGES[1:]:
        if page.stem != "index":
            assert re.search(rf"^{re.escape(page.stem)}$", index, re.M), f"{page.name} is not in index.md's toctree"
    assert re.search(r"^MATH$", index, re.M)


# ---------------------------------------------------------------- python blocks

def _skip_reason(code: str) -> str | None:
    if "engine.make_private(module=model" in code:
        return ("needs a PyTorch model, optimizer and data loader: executed with them by "
                "tests/test_interop_readme.py::test_opacus_recipe")
    for mod in ("opacus", "torch"):
        if re.search(rf"^\s*(from|import) {mod}\b", code, re.M) and not HAVE[mod]:
            return f"{mod} is not installed"
    return None


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, ("python",))], ids=lambda p: p.name)
def test_python_blocks_run(page, scratch, capsys):
    import warnings

    ns: dict = {"__name__": f"guide_{page.stem}"}
    failures, ran = [], 0
    for line, _, code in blocks(page, ("python",)):
        reason = _skip_reason(code)
        if reason:
            with capsys.disabled():
                print(f"\n{page.name}:{line}: block not executed here: {reason}")
            continue
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                for cat in (DeprecationWarning, FutureWarning):  # the guide uses no deprecated spelling
                    warnings.filterwarnings("error", category=cat, module=r"(guide_|pldlib|sweeps)")
                exec(compile(code, f"{page.name}:{line}", "exec"), ns)
        except BaseException as e:  # noqa: BLE001 - every block's failure is reported
            failures.append(f"{page.name}:{line}: {type(e).__name__}: {e}")
        ran += 1
        dt = time.perf_counter() - t0
        if dt > 120:  # (a guard against a hanging example, not a speed target: those are benchmarks)
            failures.append(f"{page.name}:{line}: took {dt:.1f} s; a guide example must be quick")
    print(f"{page.name}: {ran} python blocks executed")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------- command-line blocks

def _commands(code: str) -> list[tuple[str, str]]:
    """(command, shown output) pairs of a console block: ``$ cmd`` lines and what follows."""
    out, cmd, shown = [], None, []
    for ln in code.splitlines():
        if ln.startswith("$ "):
            if cmd is not None:
                out.append((cmd, "\n".join(shown)))
            cmd, shown = ln[2:].strip(), []
        elif cmd is None and re.match(r"(pldlib|sweeps) ", ln):
            out.append((ln.strip(), ""))
        elif cmd is not None:
            shown.append(ln)
    if cmd is not None:
        out.append((cmd, "\n".join(shown)))
    return [(c, s) for c, s in out if re.match(r"(pldlib|sweeps) ", c)]


def _pattern(shown: str) -> re.Pattern:
    parts = []
    for piece in re.split(r"(\.\.\.|[ \t]+|\n)", shown.strip()):
        if piece == "...":
            parts.append(r"[\s\S]*?")
        elif piece == "\n":
            parts.append(r"[ \t]*\n")
        elif piece and piece.isspace():
            parts.append(r"[ \t]+")
        else:
            parts.append(re.escape(piece))
    return re.compile("".join(parts) + r"[ \t]*")


CLI_PAGES = [p for p in PAGES if any(_commands(c) for _, _, c in blocks(p, ("console", "bash")))]


@pytest.mark.parametrize("page", CLI_PAGES, ids=lambda p: p.name)
def test_command_blocks_run(page, scratch):
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    failures, ran = [], 0
    for line, _, code in blocks(page, ("console", "bash")):
        for cmd, shown in _commands(code):
            argv = cmd.split()
            argv[0] = str(BIN / argv[0])
            r = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
            ran += 1
            out = (r.stdout if r.stdout.strip() else r.stderr).strip()
            where = f"{page.name}:{line}: `{cmd}`"
            if r.returncode != 0 and not shown.strip():
                failures.append(f"{where}: exit status {r.returncode} (a failing command must show its "
                                f"output)\n{r.stderr.strip()}")
            elif shown.strip() and not _pattern(shown).fullmatch(out):
                failures.append(f"{where}: output differs from the page\n--- page\n{shown.strip()}\n"
                                f"--- actual\n{out}")
    print(f"{page.name}: {ran} commands executed")
    assert ran and not failures, "\n\n".join(failures)


def test_output_pattern():
    assert _pattern("a  b ...\nc").fullmatch("a b anything\nmore\nc")
    assert not _pattern("a b\nc").fullmatch("a b\nd")


# ---------------------------------------------------------------- numbers, labels, length

def test_generated_numbers_come_from_results(tmp_path, monkeypatch):
    sys.path.insert(0, str(DOCS))
    try:
        import gen_numbers
    finally:
        sys.path.remove(str(DOCS))
    monkeypatch.setattr(gen_numbers, "OUT", tmp_path)
    written = gen_numbers.main()
    assert written and all(p.read_text().strip() for p in written)
    included = set()
    for page in PAGES:
        included |= set(re.findall(r"```\{include\} _generated/(\w+)\.md", page.read_text()))
    assert included == {p.stem for p in written}, "every generated file is shown, and only those"
    # a spot check against the report itself
    calib = (ROOT / "results" / "CALIBRATION.md").read_text()
    for row in (tmp_path / "calibration.md").read_text().splitlines()[4:-2]:
        sigma = row.split("|")[2].strip()
        assert sigma in calib


LABELS = re.compile(r"\bissue\s*#?\d+|#\d{1,4}\b|\bseed\s+0\d\d\b|\bgoal\s+\d+\s+of\b|\binstructions?\s+(count|per)",
                    re.I)


def test_no_internal_labels_in_user_facing_text():
    found = []
    for page in PAGES + [DOCS / "MATH.md"] + sorted((DOCS / "_generated").glob("*.md")):
        for i, ln in enumerate(page.read_text().splitlines(), 1):
            if LABELS.search(ln):
                found.append(f"{page.name}:{i}: {ln.strip()}")
    assert not found, "\n".join(found)


def test_readme_is_one_screen():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n < 150, f"README.md has {n} lines"



def test_yaml_configs_in_the_guide_are_valid():
    """Every ```yaml block is a sweep config that ``sweeps`` accepts as written."""
    import yaml

    from sweeps.config import parse_config

    n = 0
    for page in PAGES:
        for line, _, code in blocks(page, ("yaml",)):
            parse_config(yaml.safe_load(code), source=f"{page.name}:{line}")
            n += 1
    assert n
