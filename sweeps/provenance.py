"""What produced a store: package version, git commit, a hash of the numeric code, library versions.

:func:`environment` describes one process (the driver, or a worker through
:mod:`sweeps.preflight`); :func:`code_changes` says what differs between two
such descriptions (resume warnings, worker mismatches).  Nothing here imports
Dask or touches a store.
"""
from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

__all__ = ["LIBS", "package_version", "code_hash", "git_info", "environment", "code_changes",
           "MUST_MATCH"]

#: library versions recorded for the driver and every worker
LIBS = ("numpy", "scipy", "dask", "distributed", "xarray", "zarr")
#: what workers must share with the driver (the workers compute; they never write the store,
#: so their xarray / zarr versions are recorded but may differ)
MUST_MATCH = ("pldlib", "pldlib_code", "sweeps_code", "python", "numpy", "scipy", "dask", "distributed")


def package_version(dist: str = "pldlib") -> str:
    """The installed distribution's version (its metadata), else ``pldlib.__version__``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        import pldlib

        return str(getattr(pldlib, "__version__", "unknown"))


def _tree_hash(root: Path) -> str:
    """sha256 over the relative paths and bytes of every ``.py`` file under ``root`` (subpackages too)."""
    h = hashlib.sha256()
    files = []
    for dirpath, dirnames, names in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        files += [Path(dirpath) / n for n in names if n.endswith(".py")]
    for f in sorted(files, key=lambda p: p.relative_to(root).as_posix()):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


@lru_cache(maxsize=None)
def code_hash(package: str = "pldlib") -> str:
    """Hash of the ``.py`` files of the installed ``package`` (found via ``package.__file__``)."""
    mod = __import__(package)
    return _tree_hash(Path(mod.__file__).resolve().parent)


@lru_cache(maxsize=None)
def git_info(path: str) -> dict | None:
    """``{"commit", "dirty"}`` of the git checkout holding ``path``, None outside one (or no git)."""
    def git(*args):
        return subprocess.run(["git", "-C", path, *args], capture_output=True, text=True, timeout=10)

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0:
            return None
        head = git("rev-parse", "HEAD")
        st = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(st.stdout.strip()), "root": top.stdout.strip()}


def _version(mod: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(mod)
    except PackageNotFoundError:
        try:
            return str(__import__(mod).__version__)
        except Exception:
            return "not installed"


def environment(git: bool = True) -> dict:
    """This process: pldlib version and code hash, sweeps code hash, git state, python, libraries."""
    import pldlib

    out = {
        "pldlib": package_version(),
        "pldlib_code": code_hash("pldlib"),
        "sweeps_code": code_hash("sweeps"),
        "pldlib_path": str(Path(pldlib.__file__).resolve().parent),
        "python": platform.python_version(),
        "executable": sys.executable,
    }
    if git:
        out["git"] = git_info(out["pldlib_path"])
    for lib in LIBS:
        out[lib] = _version(lib)
    return out


def _short(key: str, v) -> str:
    if key.endswith("_code") and isinstance(v, str):
        return v[:12]
    return str(v)


def code_changes(old: dict, new: dict, keys=None) -> list[str]:
    """``["pldlib code hash 1a2b.. -> 3c4d..", "numpy 2.4.0 -> 2.5.1", ...]``: what differs."""
    keys = keys or (("pldlib", "pldlib_code", "sweeps_code") + LIBS)
    names = {"pldlib_code": "pldlib code hash", "sweeps_code": "sweeps code hash", "pldlib": "pldlib version"}
    out = []
    for k in keys:
        if k in old and k in new and old[k] != new[k]:
            out.append(f"{names.get(k, k)} {_short(k, old[k])} -> {_short(k, new[k])}")
    og, ng = old.get("git") or {}, new.get("git") or {}
    if og and ng and (og.get("commit"), og.get("dirty")) != (ng.get("commit"), ng.get("dirty")):
        out.append(f"git {og.get('commit', '?')[:10]}{' (dirty)' if og.get('dirty') else ''} -> "
                   f"{ng.get('commit', '?')[:10]}{' (dirty)' if ng.get('dirty') else ''}")
    return out
