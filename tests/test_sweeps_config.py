"""sweeps config: parsing, generators, validation errors naming the field, fingerprint."""
import copy
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from sweeps.config import ConfigError, check_store_writable, load_config, parse_config
from sweeps.testing import small_config

ROOT = Path(__file__).resolve().parent.parent


def base():
    return small_config("results/x.zarr")


def test_shipped_configs_parse():
    demo = load_config(ROOT / "configs" / "demo.yaml")
    assert demo.name == "demo" and demo.methods == ("pld",)
    assert len(demo.sigma) == 6 and demo.sigma[0] == pytest.approx(0.6) and demo.sigma[-1] == pytest.approx(4.0)
    assert demo.steps == (10, 100, 1000, 10000)
    assert demo.options["pld"].get("spacing") is None  # automatic accuracy
    small = load_config(ROOT / "configs" / "test_small.yaml")
    assert small.q == (1.0,) and small.sampling == ("none",)


def test_generators_and_defaults():
    d = base()
    d["grid"] = {"sigma": {"linspace": [1, 2, 3]}, "steps": {"geomspace": [1, 10, 12]},
                 "delta": ["1e-5", 1.0e-6]}  # YAML 1.1 reads 1e-5 as a string: accepted
    cfg = parse_config(d)
    assert cfg.sigma == (1.0, 1.5, 2.0)
    # geomspace(1, 10, 12) rounded to integers and deduplicated, ascending
    assert cfg.steps == tuple(sorted(set(int(round(x)) for x in np.geomspace(1, 10, 12))))
    assert all(isinstance(s, int) for s in cfg.steps)
    assert cfg.delta == (1e-5, 1e-6)
    assert cfg.q == (1.0,) and cfg.sampling == ("none",) and cfg.relation == ("add_remove",)
    assert cfg.options["pld"]["spacing"] == 2e-3


def test_fingerprint():
    a = parse_config(base())
    d = base()
    d["name"], d["store"] = "other", "elsewhere.zarr"
    d["grid"]["sigma"] = {"linspace": [1.0, 2.0, 2]}   # the same values as [1.0, 2.0]
    d["options"]["pld"]["sleep"] = 0.5                 # test-only timing option: not part of it
    assert parse_config(d).fingerprint() == a.fingerprint()
    d["grid"]["delta"] = [1e-5, 1e-9]
    assert parse_config(d).fingerprint() != a.fingerprint()
    d = base()
    d["options"]["pld"]["spacing"] = 1e-3
    assert parse_config(d).fingerprint() != a.fingerprint()


def _set(d, path, value):
    keys = path.split(".")
    cur = d
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    if value is _DELETE:
        del cur[keys[-1]]
    else:
        cur[keys[-1]] = value


class _Delete:
    """Sentinel: remove the key (a stable repr keeps test ids equal across processes)."""

    def __repr__(self) -> str:
        return "<deleted>"


_DELETE = _Delete()

BAD = [
    # (path to change, new value, field in message, words in message)
    ("grid.temperature", [1, 2], "grid.temperature", "unknown axis"),
    ("grid.sigma", [1.0, -1.0], "grid.sigma[1]", "> 0"),
    ("grid.sigma", [0], "grid.sigma[0]", "> 0"),
    ("grid.q", [1.5], "grid.q[0]", "(0, 1]"),
    ("grid.q", [0.0], "grid.q[0]", "(0, 1]"),
    ("grid.sigma", [], "grid.sigma", "empty"),
    ("grid.sigma", {"geomspace": [1, 2, 0]}, "grid.sigma", "empty"),
    ("grid.delta", _DELETE, "grid.delta", "missing"),
    ("methods", ["pld", "magic"], "methods[1]", "unknown method 'magic'"),
    ("methods", [], "methods", "non-empty"),
    ("grid.sampling", ["bernoulli"], "grid.sampling[0]", "unknown value 'bernoulli'"),
    ("grid.relation", ["swap"], "grid.relation[0]", "unknown value 'swap'"),
    ("grid.steps", [10, 2.5], "grid.steps[1]", "integer >= 1"),
    ("grid.steps", [0], "grid.steps[0]", "integer >= 1"),
    ("grid.steps", ["ten"], "grid.steps[0]", "number"),
    ("grid.delta", [1e-5, 0.0], "grid.delta[1]", "(0, 1)"),
    ("grid.delta", [1.0], "grid.delta[0]", "(0, 1)"),
    ("grid.delta", [1e-5, 1e-5], "grid.delta[1]", "duplicate"),
    ("grid.sigma", {"logspace": [1, 2, 3]}, "grid.sigma", "unknown generator"),
    ("grid.sigma", {"geomspace": [0, 2, 3]}, "grid.sigma.geomspace", "> 0"),
    ("grid.q", [0.01], "grid.sampling", "'none' needs q = 1"),
    ("mechanism", "exponential", "mechanism", "unknown mechanism"),
    ("colour", "blue", "colour", "unknown key"),
    ("options.pld.precision", 3, "options.pld.precision", "unknown option"),
    ("options.pld.spacing", -1.0, "options.pld.spacing", "> 0"),
    ("options.rdp", {"orders": [2]}, "options.rdp", "not in methods"),
    ("grid", [1, 2], "grid", "mapping"),
]


@pytest.mark.parametrize("path,value,fld,words", BAD, ids=[f"{b[0]}={b[1]!r}" for b in BAD])
def test_bad_config_names_field(path, value, fld, words):
    d = copy.deepcopy(base())
    _set(d, path, value)
    with pytest.raises(ConfigError) as ei:
        parse_config(d)
    msg = str(ei.value)
    assert ei.value.field == fld, msg
    assert msg.startswith(f"{fld}: ")
    assert words in msg


def test_not_a_mapping():
    with pytest.raises(ConfigError, match=r"^config: must be a mapping"):
        parse_config([1, 2, 3])


def test_unreadable_and_invalid_files(tmp_path):
    with pytest.raises(ConfigError, match=r"^config: cannot read .*nope.yaml.*No such file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"^config: cannot read"):
        load_config(tmp_path)  # a directory
    bad = tmp_path / "bad.yaml"
    bad.write_text("grid: {sigma: [1, 2\nsteps: [")
    with pytest.raises(ConfigError, match=r"^config: .*not valid YAML"):
        load_config(bad)


def test_store_writability(tmp_path):
    check_store_writable(str(tmp_path / "new" / "deeper" / "s.zarr"))  # creatable
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(ConfigError, match=r"^store: .*not a directory"):
        check_store_writable(str(f))
    with pytest.raises(ConfigError, match=r"^store: cannot create .*not a directory"):
        check_store_writable(str(f / "s.zarr"))
    if os.geteuid() != 0:  # root may write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(ConfigError, match=r"^store: cannot create .*not writable"):
                check_store_writable(str(ro / "s.zarr"))
        finally:
            ro.chmod(0o700)


def test_yaml_roundtrip_of_canonical():
    cfg = parse_config(base())
    data = yaml.safe_load(cfg.to_yaml())  # what the store keeps in attrs["sweeps_config"]
    data.pop("format")
    assert parse_config(data).fingerprint() == cfg.fingerprint()


def test_retired_sigma_table_config_says_what_replaces_it():
    """A config with the retired ``kind: sigma_table`` gets an error naming ``kind`` and the atlas."""
    with pytest.raises(ConfigError) as e:
        parse_config({"kind": "sigma_table", "name": "t", "grid": {}})
    assert "kind" in str(e.value) and "atlas" in str(e.value)
