"""Adding a mechanism or a method: each is one new module (written here, in the test) that
registers itself; with this test that is 2 files, within the 3 (mechanism) and 2 (method) the
design promises.  The new mechanism and method are then usable from the API, the command line
(in process, and in another process through ``PLDLIB_PLUGINS``) and a sweep's task, and their
answers are checked against the closed form of the Gaussian composition."""
from __future__ import annotations

import importlib
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm

ROOT = Path(__file__).resolve().parent.parent

#: a toy mechanism in one module: an event, its pair, the Mechanism sugar and its descriptor.
#: Gaussian noise of std ``width`` with sensitivity 1, i.e. the Gaussian pair with mu = 1/width
TOY_MECHANISM = '''
from dataclasses import dataclass

from pldlib import events as E
from pldlib.mechanisms import Mechanism, MechanismSpec, register_mechanism
from pldlib.profiles.base import GaussianProfile
from pldlib.profiles.pairs import register


@dataclass(frozen=True, repr=False)
class ToyEvent(E.BaseEvent):
    width: float


@dataclass(frozen=True, repr=False)
class Toy(Mechanism):
    width: float

    def base_event(self):
        return ToyEvent(self.width)


register(ToyEvent, pair=lambda e, c: GaussianProfile(sigma=e.width / c))
register_mechanism(MechanismSpec("toy", Toy, "width", "toy noise width (a Gaussian of std width)"))
'''

#: a toy method in one module: eps(delta) of k unsampled Gaussian steps in closed form
TOY_METHOD = '''
import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm

from pldlib import events as E
from pldlib.methods import Accountant, Interval, register_method


class ClosedFormGaussian(Accountant):
    method = "toy_closed_form"
    kind = "certified"

    def _unsupported(self, step):
        return None if isinstance(step.event, E.GaussianEvent) else "unsampled Gaussian steps only"

    def _mu(self):
        return sum(k * (s.event.sensitivity / s.event.sigma) ** 2 for s, k in self._steps) ** 0.5

    def delta(self, epsilon):
        mu, e = self._mu(), np.asarray(epsilon, dtype=float)
        d = norm.cdf(mu / 2 - e / mu) - np.exp(e) * norm.cdf(-mu / 2 - e / mu)
        return Interval(d, d)

    def epsilon(self, delta):
        mu = self._mu()
        one = lambda t: brentq(lambda e: float(self.delta(e)[1]) - t, -50, 300, xtol=1e-13)
        e = np.vectorize(one)(np.asarray(delta, dtype=float))
        return Interval(e * (1 - 1e-9) - 1e-12, e * (1 + 1e-9) + 1e-12) if e.ndim else Interval(
            float(e) * (1 - 1e-9) - 1e-12, float(e) * (1 + 1e-9) + 1e-12)


register_method("toy_closed_form", ClosedFormGaussian, kind="certified", summary="test: closed-form Gaussian")
'''


def gaussian_eps(mu: float, delta: float) -> float:
    """eps(delta) of the Gaussian pair N(0,1) vs N(mu,1) (closed form, scipy)."""
    return brentq(lambda e: norm.cdf(mu / 2 - e / mu) - np.exp(e) * norm.cdf(-mu / 2 - e / mu) - delta, -50, 300,
                  xtol=1e-14)


@pytest.fixture()
def plugin_dir(tmp_path, monkeypatch):
    """A folder for plugin modules; every registry is restored after the test."""
    import pldlib.mechanisms
    import pldlib.methods
    import pldlib.profiles.pairs
    import sweeps.store

    for mod, name in ((pldlib.methods, "_METHODS"), (pldlib.mechanisms, "_SPECS"),
                      (pldlib.profiles.pairs, "_MATHS")):
        monkeypatch.setattr(mod, name, dict(getattr(mod, name)))
    monkeypatch.setattr(sweeps.store, "_FORMATS", list(sweeps.store._FORMATS))
    written = []

    def write(name, text):
        p = tmp_path / f"{name}.py"
        p.write_text(text)
        written.append(p)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, name, raising=False)
        mod = importlib.import_module(name)
        return mod

    yield tmp_path, write, written


def cli_json(argv):
    from pldlib import cli

    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.main(argv)
    return code, json.loads(out.getvalue()) if code == 0 else None


def test_a_toy_mechanism_needs_one_module(plugin_dir):
    tmp, write, written = plugin_dir
    toy = write("pldlib_toy_mechanism", TOY_MECHANISM)
    assert len(written) + 1 <= 3  # the module and this test
    import pldlib
    from pldlib.mechanisms import mechanism_names

    assert "toy" in mechanism_names()
    truth = gaussian_eps(np.sqrt(50) / 2.0, 1e-6)  # 50 steps of width 2: mu = sqrt(50) / 2
    lo, up = pldlib.account(toy.Toy(width=2.0), steps=50).epsilon(1e-6)
    assert lo <= truth <= up and up - lo < 1e-2 * truth
    # the command line reads the descriptor: --mechanism toy and its flag --width
    code, out = cli_json(["epsilon", "--mechanism", "toy", "--width", "2", "--steps", "50", "--delta", "1e-6",
                          "--json"])
    assert code == 0
    (row,) = out["epsilon"]
    assert row["lower"] <= truth <= row["upper"]
    # the sweep config and the task read it too (the axis sigma holds the toy's width)
    from sweeps.config import parse_config
    from sweeps.methods import run_block

    cfg = parse_config({"name": "toy", "store": str(tmp / "t.zarr"), "mechanism": "toy", "methods": ["pld"],
                        "grid": {"sigma": [2.0], "q": [1.0], "steps": [50], "delta": [1e-6],
                                 "sampling": ["none"], "relation": ["add_remove"]}})
    assert cfg.mechanism == "toy"
    res = run_block({"index": 0, "params": {"mechanism": "toy", "sigma": 2.0, "q": 1.0, "sampling": "none",
                                            "relation": "add_remove", "method": "pld"},
                     "steps": [50], "deltas": [1e-6], "options": cfg.options["pld"]})
    assert res["error"] == "" and res["eps_lower"][0, 0] <= truth <= res["eps_upper"][0, 0]


def test_a_toy_method_needs_one_module(plugin_dir):
    tmp, write, written = plugin_dir
    write("pldlib_toy_method", TOY_METHOD)
    assert len(written) + 1 <= 2  # the module and this test
    import pldlib
    from pldlib.methods import make_accountant, method_names

    assert "toy_closed_form" in method_names()
    truth = gaussian_eps(np.sqrt(100) / 1.5, 1e-5)
    lo, up = make_accountant("toy_closed_form").compose(pldlib.GaussianEvent(1.5), 100).epsilon(1e-5)
    assert lo <= truth <= up
    code, out = cli_json(["epsilon", "--mechanism", "gaussian", "--sigma", "1.5", "--steps", "100", "--delta",
                          "1e-5", "--method", "toy_closed_form", "--json"])
    assert code == 0
    (row,) = out["epsilon"]
    assert row["lower"] <= truth <= row["upper"]
    from sweeps.config import parse_config
    from sweeps.methods import run_block

    cfg = parse_config({"name": "toy", "store": str(tmp / "m.zarr"), "methods": ["toy_closed_form", "pld"],
                        "mechanism": "gaussian",
                        "grid": {"sigma": [1.5], "q": [1.0, 0.5], "steps": [100], "delta": [1e-5],
                                 "sampling": ["poisson"], "relation": ["add_remove"]}})
    spec = {"index": 0, "params": {"mechanism": "gaussian", "sigma": 1.5, "q": 1.0, "sampling": "none",
                                   "relation": "add_remove", "method": "toy_closed_form"},
            "steps": [100], "deltas": [1e-5], "options": cfg.options["toy_closed_form"]}
    res = run_block(spec)
    assert res["error"] == "" and res["eps_lower"][0, 0] <= truth <= res["eps_upper"][0, 0]
    # an event it cannot take: status 3 (unsupported) with its reason, not a failure of the sweep
    res = run_block({**spec, "params": {**spec["params"], "q": 0.5, "sampling": "poisson"}})
    assert res["unsupported"].all() and "unsampled Gaussian steps only" in res["error"]


def test_plugins_reach_another_process(plugin_dir):
    """The command line in a fresh process imports the modules named in PLDLIB_PLUGINS."""
    tmp, write, _ = plugin_dir
    (tmp / "pldlib_toy_mechanism2.py").write_text(TOY_MECHANISM.replace('"toy"', '"toy2"'))
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{ROOT}", "PLDLIB_PLUGINS": "pldlib_toy_mechanism2"}
    argv = [sys.executable, "-m", "pldlib", "epsilon", "--mechanism", "toy2", "--width", "2", "--steps", "50",
            "--delta", "1e-6", "--json"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (row,) = data["epsilon"]
    truth = gaussian_eps(np.sqrt(50) / 2.0, 1e-6)
    assert row["lower"] <= truth <= row["upper"]
    bad = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                         env={**env, "PLDLIB_PLUGINS": "no_such_module_xyz"})
    assert bad.returncode == 2 and "PLDLIB_PLUGINS" in bad.stderr and "no_such_module_xyz" in bad.stderr


#: a toy store format in one module: a folder of .npy files (one per variable) and meta.json
TOY_FORMAT = '''
import json
import os

import numpy as np
import xarray as xr

from sweeps.store import StoreFormat, region_key, register_format


def _save(path, arr):
    tmp = path + ".tmp.npy"
    np.save(tmp, arr.astype(object) if arr.dtype.kind == "T" else arr, allow_pickle=True)
    os.replace(tmp, path)


class NpyFolder(StoreFormat):
    name = "npy-folder"
    last = ("meta.json",)

    def matches(self, path):
        return path.rstrip("/").endswith(".npys")

    def write_skeleton(self, target, ds, encoding, append):
        os.makedirs(target, exist_ok=append)
        meta = {"attrs": dict(ds.attrs), "vars": {}, "coords": {}}
        for v, da in ds.data_vars.items():
            _save(os.path.join(target, v + ".npy"), np.asarray(da.values))
            meta["vars"][v] = {"dims": list(da.dims), "attrs": dict(da.attrs)}
        for c, da in ds.coords.items():
            meta["coords"][c] = [x.item() if hasattr(x, "item") else str(x) for x in da.values]
        with open(os.path.join(target, "meta.json"), "w") as f:
            json.dump(meta, f, default=str)

    def _meta(self, path):
        with open(os.path.join(path, "meta.json")) as f:
            return json.load(f)

    def read_attrs(self, path):
        try:
            return self._meta(path)["attrs"]
        except (OSError, ValueError):
            return None

    def update_attrs(self, path, attrs):
        meta = self._meta(path)
        meta["attrs"].update(attrs)
        tmp = os.path.join(path, "meta.json.tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f, default=str)
        os.replace(tmp, os.path.join(path, "meta.json"))

    def read_var(self, path, var):
        a = np.load(os.path.join(path, var + ".npy"), allow_pickle=True)
        return a.astype(str) if a.dtype == object else a

    def shapes(self, path):
        return {v: tuple(np.load(os.path.join(path, v + ".npy"), allow_pickle=True, mmap_mode=None).shape)
                for v in self._meta(path)["vars"]}

    def open_dataset(self, path):
        meta = self._meta(path)
        data = {v: xr.Variable(m["dims"], self.read_var(path, v), m["attrs"]) for v, m in meta["vars"].items()}
        return xr.Dataset(data, coords={c: np.asarray(vals) for c, vals in meta["coords"].items()},
                          attrs=meta["attrs"])

    def open_writer(self, path, plan):
        fmt = self

        class Writer:
            def write(self, prepared, fresh):
                for group in ("data", "commit"):
                    names = {v for p in prepared for v in p[group]}
                    for v in names:
                        a = fmt.read_var(path, v)
                        for p in prepared:
                            if v in p[group]:
                                a[region_key(p, v)] = p[group][v]
                        _save(os.path.join(path, v + ".npy"), a)

        return Writer()


register_format(NpyFolder())
'''


def test_a_toy_store_format_needs_one_module(plugin_dir, embedded_client):
    """A sweep into the toy format: the same cells as into zarr, resumable the same way."""
    tmp, write, written = plugin_dir
    write("sweeps_toy_format", TOY_FORMAT)
    assert len(written) + 1 <= 2  # the module and this test
    from sweeps.config import parse_config
    from sweeps.execute import run_sweep
    from sweeps.store import format_for, open_dataset
    from sweeps.testing import small_config

    quiet = {"progress": False, "stream": io.StringIO()}
    toy, ref = str(tmp / "s.npys"), str(tmp / "s.zarr")
    assert format_for(toy).name == "npy-folder" and format_for(ref).name == "zarr"
    rep = run_sweep(parse_config(small_config(toy)), client=embedded_client, **quiet)
    assert rep.ok == rep.n_blocks and rep.complete
    run_sweep(parse_config(small_config(ref)), client=embedded_client, **quiet)
    a, b = open_dataset(toy), open_dataset(ref)
    for v in ("eps_lower", "eps_upper", "status"):
        np.testing.assert_array_equal(a[v].values, b[v].transpose(*a[v].dims).values)
    assert a.attrs["sweeps_fingerprint"] == b.attrs["sweeps_fingerprint"] and a.attrs["complete"]
    again = run_sweep(parse_config(small_config(toy)), client=embedded_client, **quiet)
    assert again.submitted == 0  # resumed: nothing left to compute
