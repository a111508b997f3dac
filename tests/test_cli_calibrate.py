"""`pldlib calibrate`: JSON contract, certified answer, exit status 2 on bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import pldlib
from pldlib import cli


def run_main(argv, capsys):
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrate_json_contract_and_certificate(capsys):
    code, out, err = run_main(["calibrate", "--epsilon", "2", "--delta", "1e-5", "--q", "0.02",
                               "--steps", "500", "--no-table", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert set(d) >= {"sigma", "epsilon", "seconds", "params"}
    assert set(d["epsilon"]) == {"lower", "upper"}
    assert d["params"]["q"] == 0.02 and d["params"]["steps"] == 500
    assert d["params"]["sampling"] == "poisson" and d["params"]["relation"] == "add_remove"
    assert d["epsilon"]["lower"] <= d["epsilon"]["upper"] <= 2.0
    # independent re-check of the certificate on a finer grid than the search used
    acc = pldlib.account(pldlib.Gaussian(sigma=d["sigma"], q=0.02, sampling="poisson"), steps=500,
                         spacing=d["params"]["spacing"] / 2)
    assert acc.epsilon(1e-5).upper <= 2.0
    # and the certified-infeasible end really is infeasible (re-checked at a finer grid than used)
    acc = pldlib.account(pldlib.Gaussian(sigma=d["sigma_lower"], q=0.02, sampling="poisson"), steps=500,
                         spacing=d["params"]["spacing"] / 2)
    assert acc.epsilon(1e-5).lower > 2.0


def test_calibrate_text_output(capsys):
    code, out, _ = run_main(["calibrate", "--epsilon", "1", "--delta", "1e-6", "--steps", "10",
                             "--relation", "substitution", "--no-table"], capsys)
    assert code == 0
    assert "sigma = " in out and "certified eps(delta)" in out and "sampling=none" in out


@pytest.mark.parametrize("argv,name", [
    (["--epsilon", "0", "--delta", "1e-5", "--steps", "10"], "--epsilon"),
    (["--epsilon", "nan", "--delta", "1e-5", "--steps", "10"], "--epsilon"),
    (["--epsilon", "1", "--delta", "1", "--steps", "10"], "--delta"),
    (["--epsilon", "1", "--delta", "1e-5", "--steps", "0"], "--steps"),
    (["--epsilon", "1", "--delta", "1e-5", "--steps", "10", "--q", "2"], "--q"),
    (["--epsilon", "1", "--delta", "1e-5", "--steps", "10", "--relation", "x"], "--relation"),
    (["--epsilon", "1", "--delta", "1e-5", "--steps", "10", "--q", "0.1", "--sampling", "none"], "--q"),
    (["--epsilon", "1", "--delta", "1e-5", "--steps", "10", "--tol", "-1"], "--tol"),
    (["--epsilon", "1", "--delta", "1e-5", "--steps", "10", "--table", "/no/such/table.zarr"], "--table"),
    (["--delta", "1e-5", "--steps", "10"], "--epsilon"),
])
def test_calibrate_bad_input_exit_2(argv, name, capsys):
    code, out, err = run_main(["calibrate", *argv], capsys)
    assert code == 2
    assert out == ""
    assert name in err and err.count("\n") == 1


def test_module_entry_point():
    r = subprocess.run([sys.executable, "-m", "pldlib", "calibrate", "--epsilon", "1", "--delta", "1e-5",
                        "--steps", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "--steps" in r.stderr


@pytest.mark.parametrize("kind", ["directory", "text", "npz_without_meta"])
def test_calibrate_table_that_is_not_an_atlas_exit_2(kind, tmp_path, capsys):
    """--table must be an atlas .npz: a directory (e.g. a zarr sigma table of earlier versions),
    a text file or another .npz is bad input naming --table, not a traceback."""
    if kind == "directory":
        path = tmp_path / "sigma_table.zarr"
        path.mkdir()
    elif kind == "text":
        path = tmp_path / "atlas.npz"
        path.write_text("not an archive")
    else:
        path = tmp_path / "other.npz"
        np.savez(path, x=np.arange(3))
    code, out, err = run_main(["calibrate", "--epsilon", "1", "--delta", "1e-5", "--steps", "10", "--q", "0.01",
                               "--table", str(path)], capsys)
    assert code == 2 and out == ""
    assert "--table" in err and "atlas" in err and err.count("\n") == 1
