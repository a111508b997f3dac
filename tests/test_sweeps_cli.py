"""sweeps command line: exit status 2 + one stderr line on bad input, store untouched; reports."""
import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import xarray as xr

from sweeps.cli import main
from sweeps.config import parse_config
from sweeps.execute import run_sweep
from sweeps.testing import small_config, tree_snapshot, write_config

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def made(tmp_path_factory, embedded_client):
    """A finished test_small store and its config file."""
    d = tmp_path_factory.mktemp("cli")
    store = d / "s.zarr"
    cfg_path = write_config(d / "small.yaml", small_config(store))
    run_sweep(cfg_path, client=embedded_client, progress=False, stream=io.StringIO())
    return cfg_path, str(store)


def one_error_line(err: str, *words):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("sweeps: error: ") or lines[0].startswith("sweeps run: error: ")
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def bad_configs(tmp_path, store):
    def cfg(name, **changes):
        return write_config(tmp_path / f"{name}.yaml", small_config(store, **changes))

    f = tmp_path / "plainfile"
    f.write_text("x")
    other = small_config(store)
    other["grid"]["sigma"] = [1.0, -2.0]
    axis = small_config(store)
    axis["grid"]["temperature"] = [1.0]
    return [
        (write_config(tmp_path / "neg.yaml", other), [], "grid.sigma[1]: must be > 0"),
        (cfg("meth", methods=["pld", "nosuch"]), [], "methods[1]: unknown method 'nosuch'"),
        (write_config(tmp_path / "axis.yaml", axis), [], "grid.temperature: unknown axis"),
        (cfg("q", q=[0.0]), [], "grid.q[0]: sampling rate must be in (0, 1]"),
        (cfg("st", steps=[1, 0]), [], "grid.steps[1]: steps must be an integer >= 1"),
        (cfg("dl", delta=[2.0]), [], "grid.delta[0]: delta must be in (0, 1)"),
        (cfg("smp", sampling=["sometimes"]), [], "grid.sampling[0]: unknown value"),
        (cfg("rel", relation=["neighbours"]), [], "grid.relation[0]: unknown value"),
        (str(tmp_path / "missing.yaml"), [], "config: cannot read"),
        (cfg("ok"), ["--store", str(f / "s.zarr")], "store: cannot create"),
        (cfg("diff", delta=[1e-5, 1e-9]), [], "was made from a different config"),
    ]


def test_bad_input_exits_2_store_untouched(made, tmp_path, capsys):
    cfg_path, store = made
    before = tree_snapshot(store)
    for path, extra, words in bad_configs(tmp_path, store):
        rc = main(["run", path] + (extra or ["--store", store]))
        out, err = capsys.readouterr()
        assert rc == 2, (path, err)
        one_error_line(err, words)
        assert tree_snapshot(store) == before


def test_argparse_errors_are_one_line(capsys):
    for argv in (["run"], ["frobnicate"], ["run", "x.yaml", "--workers", "two"]):
        with pytest.raises(SystemExit) as ei:
            main(argv)
        assert ei.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "error:" in lines[0]


def test_console_script_exit_status(made, tmp_path):
    _, store = made
    before = tree_snapshot(store)
    bad = write_config(tmp_path / "bad.yaml", small_config(store, methods=["magic"]))
    exe = Path(sys.executable).parent / "sweeps"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "sweeps"]
    p = subprocess.run(cmd + ["run", bad], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert p.returncode == 2
    one_error_line(p.stderr, "methods[0]: unknown method 'magic'")
    assert tree_snapshot(store) == before


def test_restart_refuses_foreign_directory(tmp_path, made, capsys):
    cfg_path, _ = made
    foreign = tmp_path / "precious"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("do not delete")
    before = tree_snapshot(foreign)
    rc = main(["run", cfg_path, "--store", str(foreign), "--restart"])
    assert rc == 2
    one_error_line(capsys.readouterr().err, "is not a sweeps store")
    assert tree_snapshot(foreign) == before


def test_restart_starts_over(tmp_path, made, capsys):
    cfg_path, store = made
    mine = tmp_path / "mine.zarr"
    shutil.copytree(store, mine)
    new = write_config(tmp_path / "new.yaml", small_config(mine, sigma=[3.0], relation=["add_remove"]))
    assert main(["run", new]) == 2
    capsys.readouterr()
    rc = main(["run", new, "--restart", "--workers", "1", "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "submitted 1 blocks, 1 ok, 0 failed" in out
    ds = xr.open_zarr(mine, chunks=None)
    assert ds.sizes["sigma"] == 1 and (ds.status.values == 1).all()
    assert ds.attrs["sweeps_fingerprint"] == parse_config(small_config(mine, sigma=[3.0], relation=["add_remove"])).fingerprint()
    # and a second run has nothing to do
    assert main(["run", new]) == 0
    assert "nothing to do" in capsys.readouterr().out


def test_status_show_plot(made, tmp_path, capsys):
    cfg_path, store = made
    assert main(["status", store]) == 0
    out = capsys.readouterr().out
    assert "blocks    done 4, failed 0, missing 0" in out
    assert "cells     ok 24, failed 0, missing 0" in out and "compute" in out
    assert main(["show", store, "--sel", "sigma=1", "relation=substitution"]) == 0
    out = capsys.readouterr().out
    assert "sigma=1 q=1 sampling=none relation=substitution method=pld" in out
    assert out.count("[") >= 6 and "delta=1e-05" in out
    png = tmp_path / "p" / "plot.png"
    assert main(["plot", store, "--sel", "relation=add_remove", "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not Path(str(png) + ".tmp").exists()
    for argv, words in ((["show", store, "--sel", "sigma=7"], "--sel sigma=7: no such value"),
                        (["show", store, "--sel", "colour=red"], "unknown dimension 'colour'"),
                        (["show", store, "--sel", "sigma"], "expected key=value"),
                        (["status", str(tmp_path / "nothing.zarr")], "is not a zarr store"),
                        (["plot", str(tmp_path / "nothing.zarr")], "is not a zarr store")):
        assert main(argv) == 2
        one_error_line(capsys.readouterr().err, words)


def test_run_with_failed_blocks_exits_1(tmp_path, capsys, embedded_cluster):
    d = small_config(tmp_path / "f.zarr", sigma=[2.0], relation=["add_remove"], steps=[1])
    d["options"]["pld"]["fail"] = True
    path = write_config(tmp_path / "f.yaml", d)
    rc = main(["run", path, "--scheduler", embedded_cluster.scheduler_address, "--no-progress"])
    out, err = capsys.readouterr()
    assert rc == 1 and "submitted 1 blocks, 0 ok, 1 failed" in out
    assert main(["status", str(tmp_path / "f.zarr")]) == 0
    out = capsys.readouterr().out
    assert "blocks    done 0, failed 1, missing 0" in out and "test-only 'fail'" in out


def test_unreachable_scheduler_exits_2_nothing_written(tmp_path, capsys):
    import dask

    path = write_config(tmp_path / "s.yaml", small_config(tmp_path / "never.zarr"))
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        rc = main(["run", path, "--scheduler", "tcp://127.0.0.1:9"])
    assert rc == 2
    one_error_line(capsys.readouterr().err, "scheduler: cannot connect to 'tcp://127.0.0.1:9'")
    assert not (tmp_path / "never.zarr").exists()
