"""The layering of the code, checked by walking every import statement (module level and inside
functions): no import circles in ``pldlib/`` or ``sweeps/``, and no module imports one of a
higher layer.

Layers, lowest first (a module may import its own layer and those below):

0. ``pldlib._validate``, ``pldlib.allocator``, ``pldlib._deadline`` -- argument checks, process
   tuning, the hard time limit
1. ``pldlib.events`` -- events as pure data
2. ``pldlib.profiles`` -- the hockey-stick maths of each mechanism's pairs
3. ``pldlib.pld`` (grid, discretisation, FFT composition, trade-off curves), ``pldlib.exact``
4. ``pldlib.sampling``, ``pldlib.mechanisms`` -- sampling schemes' pairs, mechanism sugar
5. ``pldlib.methods`` -- the accountants (ours and the peers') behind one interface
6. ``pldlib.calibrate``, ``pldlib.calibration``, ``pldlib.attack``, ``pldlib.atlas`` -- questions asked of
   accountants
7. ``pldlib.interop`` -- adapters to other libraries' APIs
8. ``pldlib`` (the package's namespace), ``pldlib.cli``, ``pldlib.__main__``, ``pldlib.testing``
   (test harnesses that use the whole package), ``pldlib.plugins``, ``pldlib.web`` (the calculator page)
9. ``sweeps`` -- the batch workflow
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LAYERS = [
    ("pldlib._validate", "pldlib.allocator", "pldlib._deadline"),
    ("pldlib.events",),
    ("pldlib.profiles",),
    ("pldlib.pld", "pldlib.exact"),
    ("pldlib.sampling", "pldlib.mechanisms"),
    ("pldlib.methods",),
    ("pldlib.calibrate", "pldlib.calibration", "pldlib.attack", "pldlib.atlas", "pldlib.correlated"),
    ("pldlib.interop",),
    ("pldlib.cli", "pldlib.__main__", "pldlib", "pldlib.testing", "pldlib.plugins", "pldlib.web"),
    ("sweeps",),
]


def modules() -> dict[str, Path]:
    out = {}
    for pkg in ("pldlib", "sweeps"):
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


def imports_of(name: str, path: Path, known: dict) -> set[str]:
    """Modules of ``pldlib``/``sweeps`` that ``name`` imports anywhere in its source."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = []
        if isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else (node.module or "")
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        for t in targets:
            while t not in known and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in known and t != name:
                found.add(t)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, p, known) for m, p in known.items()}


def layer(m: str) -> int:
    best, depth = None, -1
    for i, names in enumerate(LAYERS):
        for n in names:
            if (m == n or m.startswith(n + ".")) and n.count(".") > depth:
                best, depth = i, n.count(".")
    assert best is not None, f"{m} is in no layer: add it to LAYERS"
    return best


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    g = graph()
    found = cycles(g)
    assert not found, "import circles:\n" + "\n".join(
        " <-> ".join(c) + "\n    " + "; ".join(f"{a} -> {', '.join(sorted(g[a] & set(c)))}" for a in c)
        for c in found)


def test_no_upward_imports():
    g = graph()
    up = sorted(f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
                for a, deps in g.items() for b in deps if layer(b) > layer(a))
    assert not up, "upward imports:\n" + "\n".join(up)


def test_the_walker_sees_function_level_and_relative_imports(tmp_path):
    """The checks above can fail: a function-level relative import upward is found."""
    pkg = tmp_path / "pldlib" / "events.py"
    pkg.parent.mkdir()
    pkg.write_text("def f():\n    from .methods import base\n")
    (tmp_path / "pldlib" / "__init__.py").write_text("")
    (tmp_path / "pldlib" / "methods").mkdir()
    (tmp_path / "pldlib" / "methods" / "__init__.py").write_text("from .. import events\n")
    (tmp_path / "pldlib" / "methods" / "base.py").write_text("")
    known = {"pldlib": tmp_path / "pldlib" / "__init__.py", "pldlib.events": pkg,
             "pldlib.methods": tmp_path / "pldlib" / "methods" / "__init__.py",
             "pldlib.methods.base": tmp_path / "pldlib" / "methods" / "base.py"}
    g = {m: imports_of(m, p, known) for m, p in known.items()}
    assert g["pldlib.events"] == {"pldlib.methods.base"}
    assert layer("pldlib.methods.base") > layer("pldlib.events")
    assert g["pldlib.methods"] == {"pldlib.events"}
    g["pldlib.events"].add("pldlib.methods")
    assert cycles(g) == [["pldlib.events", "pldlib.methods"]]
