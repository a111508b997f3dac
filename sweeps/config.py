"""Sweep configuration: parse a YAML file, validate it, expand generators.

A config names a grid of mechanism parameters and the accounting methods to
run on it.  ``load_config(path)`` returns a :class:`SweepConfig` whose axes
are plain tuples (generators such as ``{geomspace: [0.6, 4, 6]}`` expanded);
every problem raises :class:`ConfigError` whose message starts with the
offending field, e.g. ``grid.sigma[2]: must be > 0, got -1.0``.

``report: {eps_targets: [...]}`` sets the target epsilons for which ``sweeps
report`` inverts eps(sigma) (not part of the fingerprint); ``report:
{tradeoff_curve: {sigma, q, steps, sampling, relation, delta}}`` asks ``sweeps
report`` for the trade-off curve plot of that configuration
(:func:`sweeps.campaign.tradeoff_curve_plot`).

``grid.fpr: [1e-3, 1e-2]`` (false-positive rates in (0, 1)) makes every cell
also store the certified interval ``[tpr_lower, tpr_upper]`` of the largest
true-positive rate of any membership-inference test at each of them
(:meth:`pldlib.methods.Accountant.max_tpr`), with its own ``fpr`` dimension in
the store.  It is not a cell axis (a block spans all of it); it is part of the
fingerprint only when given, so configs without it keep theirs.

``layout:`` (``auto``, the default; ``blocks``; ``sharded``; ``{shard_blocks: N}``) chooses the
file layout of a *new* store (:mod:`sweeps.shards`: automatic = one chunk per block up to a few
thousand blocks, shards of many blocks written by the workers above), and ``task_seconds:``
the target duration of one task of a sharded store (:mod:`sweeps.cost`).  Neither is part of
the fingerprint: they change files and task sizes, not results; a resumed store keeps its layout.

``variants`` names the same method twice with different options, e.g.
``variants: {pld_buckets: pld}`` lets ``methods: [pld, pld_buckets]`` run
``pld`` with ``options.pld`` and again with ``options.pld_buckets``; the
options of a variant are those of its method, plus ``variant_of: <method>``
(which the task reads; so it is part of the fingerprint).

``mechanism:`` may be left out: it then means ``gaussian``
(:data:`DEFAULT_MECHANISM`), which ``sweeps run`` announces and the store keeps
in its ``mechanism`` and ``mechanism_source`` attributes (the fingerprint is
that of the explicit ``mechanism: gaussian``, so both forms share a store).

The *fingerprint* (sha256 of the canonical JSON of everything that decides
the results: mechanism, methods, expanded grid, method options) identifies
the sweep a store was made from; ``name`` and ``store`` are not part of it,
nor is the test-only ``sleep`` option (it changes timing, not results).

``sampling: truncated_poisson`` (a capped Poisson batch: a batch larger than B cut to a
uniform subset of B records, docs/MATH.md 2.6) needs the top-level settings ``batch_size: B``
and ``dataset_size: n`` (integers >= 1, not grid axes: one value each for the whole sweep);
they are required exactly when the sampling axis holds ``truncated_poisson`` and refused
otherwise (a ``quick:`` variant without that scheme drops them).  They are part of the
fingerprint only when given, so every other config keeps its fingerprint.  Each block's task
gets them with its parameters (:meth:`sweeps.plan.Plan.spec`).  ``sampling: with_replacement``
(batches of B independent uniform draws from n records, docs/MATH.md 2.7) takes the same two
settings, and its q axis must be B/n.  Likewise ``selections: k`` (an
integer >= 1, with ``random_allocation`` on the sampling axis): every
record in k of the t = k/q steps of each epoch, for the ``random_allocation`` cells.

A config may carry a ``quick:`` section (keys ``grid``, ``methods``,
``options``, ``store``, ``description``) for a small variant of the same
campaign: ``load_config(path, quick=True)`` (``sweeps run CONFIG --quick``)
replaces the given grid axes, the methods list and per-method options, names
the sweep ``<name>-quick`` and stores it in ``quick.store`` (default: the
store path with ``_quick`` before ``.zarr``).  The quick variant is validated
whenever the config is loaded, so a broken one is caught early.
"""
from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pldlib import _validate as V  # noqa: E402
from pldlib._validate import RELATIONS as _RELATIONS  # noqa: E402
from pldlib.mechanisms import mechanism_names, mechanism_spec  # noqa: E402
from pldlib.correlated import BANDMF_SAMPLINGS  # noqa: E402
from pldlib.sampling import sampling_names  # noqa: E402
from .errors import ConfigError  # noqa: E402,F401

__all__ = [
    "ConfigError", "SweepConfig", "load_config", "parse_config", "check_store_writable", "read_config_data",
    "tradeoff_curve_spec", "TRADEOFF_CURVE_DEFAULTS", "GRID_EXTRA",
    "AXES", "MECHANISMS", "DEFAULT_MECHANISM", "SAMPLINGS", "RELATIONS", "TRUNCATED", "TRUNCATION_KEYS", "WITH_REPLACEMENT", "SIZED",
]

#: grid axes, in the order of the dataset dimensions (``method`` comes from ``methods``)
AXES = ("sigma", "q", "steps", "delta", "sampling", "relation")
#: what the ``sigma`` axis means for each mechanism: its noise parameter, from pldlib's mechanism
#: descriptors (:func:`pldlib.mechanisms.mechanism_spec`)
MECHANISMS = {n: f"{mechanism_spec(n).noise}: {mechanism_spec(n).help}" for n in mechanism_names()}
MECHANISMS["bandmf"] = ("sigma: noise multiplier of a banded matrix mechanism (BandMF; sqrt-Toeplitz strategy, "
                        "unit column norm)")
#: the mechanism of a config without ``mechanism:`` (announced when a run starts, stored in attrs)
DEFAULT_MECHANISM = "gaussian"
#: sampling names and relations: read from pldlib (their one definition each)
SAMPLINGS = sampling_names()
RELATIONS = _RELATIONS
#: the sampling scheme of a capped Poisson batch and its top-level settings (mechanism keywords)
TRUNCATED = "truncated_poisson"
TRUNCATION_KEYS = ("batch_size", "dataset_size")
#: the sampling scheme of batches drawn with replacement: the same two settings, and q = batch_size /
#: dataset_size (docs/MATH.md 2.7)
WITH_REPLACEMENT = "with_replacement"
#: the schemes that need ``batch_size`` and ``dataset_size``
SIZED = (TRUNCATED, WITH_REPLACEMENT)
#: the sampling scheme whose top-level ``selections: k`` puts every record in k of the t = k/q steps
ALLOCATION = "random_allocation"
TOP_KEYS = ("name", "description", "store", "mechanism", "methods", "grid", "options",
            "sampling", "relation", "quick", "variants", "report", "layout", "task_seconds",
            "selections", "bands") + TRUNCATION_KEYS
#: the banded matrix mechanism (BandMF, DP-FTRL; :func:`pldlib.correlated.bandmf_run`): its sampling
#: axis holds batch selections, its q the expected batch fraction, ``bands:`` the strategies' bands
BANDMF = "bandmf"
BANDMF_RELATIONS = ("add", "remove", "add_remove")
#: grid keys that are not cell axes: false-positive rates of the TPR metric (``tpr_lower``,
#: ``tpr_upper``; a block spans all of them)
GRID_EXTRA = ("fpr",)
#: keys of ``report:`` (not part of the fingerprint)
REPORT_KEYS = ("eps_targets", "tradeoff_curve")
#: what a ``quick:`` section may override (``sweeps run CONFIG --quick``)
QUICK_KEYS = ("grid", "methods", "options", "store", "description")
GENERATORS = ("geomspace", "linspace")
#: options fingerprinted under their older names, so that stores made before a rename keep
#: their fingerprints (and resume): the PLD grid spacing was called ``interval``
LEGACY_OPTION_NAMES = {"spacing": "interval"}
#: options that change only timing and are left out of the fingerprint
FINGERPRINT_EXCLUDED_OPTIONS = ("sleep",)
CONFIG_FORMAT = 1
#: largest accepted steps value (the store keeps steps as int64)
MAX_STEPS = 10**18


@dataclass(frozen=True)
class SweepConfig:
    """A validated sweep; axes are tuples of plain Python values."""

    name: str
    store: str
    mechanism: str
    methods: tuple[str, ...]
    sigma: tuple[float, ...]
    q: tuple[float, ...]
    steps: tuple[int, ...]
    delta: tuple[float, ...]
    sampling: tuple[str, ...]
    relation: tuple[str, ...]
    options: dict = field(default_factory=dict)  # method -> {option: value}, defaults filled
    description: str = ""
    source: str | None = None  # the file it came from
    variants: dict = field(default_factory=dict)  # alias -> registered method
    report: dict = field(default_factory=dict)    # settings of `sweeps report` (not in the fingerprint)
    fpr: tuple[float, ...] = ()  # false-positive rates of the TPR metric (grid.fpr; empty: none)
    #: the config has no ``mechanism:`` key, so :data:`DEFAULT_MECHANISM` is used (announced by
    #: ``sweeps run`` and kept in the store's ``mechanism_source`` attribute; not in the fingerprint)
    mechanism_default: bool = field(default=False, compare=False)
    #: ``sampling: truncated_poisson`` only (None otherwise): the batch cap B and the number of records n
    batch_size: int | None = None
    dataset_size: int | None = None
    #: ``sampling: random_allocation`` only (None: one): every record in k of the t = k/q steps of an epoch
    selections: int | None = None
    #: store layout of a new store (``layout:``; None: automatic, see :func:`sweeps.shards.choose_layout`):
    #: "blocks", "sharded" or {"shard_blocks": N}; not in the fingerprint (it changes files, not results)
    layout: Any = field(default=None, compare=False)
    #: target seconds of one task of a sharded store (``task_seconds:``; None: the default of
    #: :mod:`sweeps.cost`); not in the fingerprint
    task_seconds: float | None = field(default=None, compare=False)
    #: ``mechanism: bandmf`` only: the band counts, each method run once per count (``pld@b4``)
    bands: tuple = ()

    def truncation(self) -> dict:
        """``{"batch_size": B, "dataset_size": n}`` when set (``truncated_poisson``), else ``{}``."""
        return {k: getattr(self, k) for k in TRUNCATION_KEYS if getattr(self, k) is not None}

    def mechanism_keywords(self) -> dict:
        """The top-level settings every block's mechanism gets (:func:`sweeps.methods.make_mechanism`
        passes each to the scheme it belongs to): :meth:`truncation` and ``selections``."""
        return {**self.truncation(), **({"selections": self.selections} if self.selections else {})}

    def base_method(self, m: str) -> str:
        """The registered method behind ``m`` (``m`` itself unless it is a variant)."""
        return self.variants.get(m, m)

    def axis(self, name: str) -> tuple:
        return self.methods if name == "method" else getattr(self, name)

    def canonical(self) -> dict:
        """Plain-data form (the expanded grid); what the store keeps in its attrs."""
        return {
            "format": CONFIG_FORMAT,
            "name": self.name,
            "description": self.description,
            "store": self.store,
            "mechanism": self.mechanism,
            "methods": list(self.methods),
            # grid.fpr only when given: configs without it keep their fingerprints
            "grid": {**{a: list(getattr(self, a)) for a in AXES}, **({"fpr": list(self.fpr)} if self.fpr else {})},
            "options": {m: dict(self.options.get(m, {})) for m in self.methods},
            # batch_size / dataset_size only when given: other configs keep their fingerprints
            **self.truncation(),
            **({"selections": self.selections} if self.selections else {}),
            **({"bands": list(self.bands)} if self.bands else {}),
            **({"variants": dict(self.variants)} if self.variants else {}),
            **({"report": dict(self.report)} if self.report else {}),
            # layout / task_seconds only when given (files and task sizes, not results)
            **({"layout": self.layout} if self.layout is not None else {}),
            **({"task_seconds": self.task_seconds} if self.task_seconds is not None else {}),
        }

    def fingerprint(self) -> str:
        """sha256 of what decides the results (see the module docstring)."""
        c = self.canonical()
        ident = {
            "format": c["format"],
            "mechanism": c["mechanism"],
            "methods": c["methods"],
            "grid": c["grid"],
            "options": {m: {LEGACY_OPTION_NAMES.get(k, k): v for k, v in o.items()
                            if k not in FINGERPRINT_EXCLUDED_OPTIONS}
                        for m, o in c["options"].items()},
            **{k: c[k] for k in TRUNCATION_KEYS + ("selections",) if k in c},  # (only when given)
        }
        text = json.dumps(ident, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.canonical(), sort_keys=False, default_flow_style=None)

    def with_store(self, store: str | None) -> "SweepConfig":
        if store is None:
            return self
        from dataclasses import replace

        return replace(self, store=str(store))


# -- scalar checks -------------------------------------------------------------
def _checked(check, fld: str, v, *extra, what: str = ""):
    """A config value through a validator of :mod:`pldlib._validate` (the one set of argument
    checks, shared with the API and the CLI); its error as a :class:`ConfigError` naming
    ``fld``.  PyYAML (YAML 1.1) reads "1e-5" (no dot) as a string: numeric strings are
    accepted."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            raise ConfigError(fld, f"must be a number, got {v!r}") from None
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ConfigError(fld, f"must be a number, got {v!r}")
    try:
        return check(what or "value", v, *extra)
    except (TypeError, ValueError) as e:
        raise ConfigError(fld, str(e).removeprefix("value ")) from None


def _number(fld: str, v) -> float:
    return _checked(V.finite, fld, v)


def _positive(fld, v) -> float:
    return _checked(V.positive_finite, fld, v)


def _q(fld, v) -> float:
    return _checked(V.sampling_rate, fld, v, what="sampling rate")


def _delta(fld, v) -> float:
    return _checked(V.probability_open, fld, v, what="delta")


def _steps(fld, v) -> int:
    x = _checked(V.steps, fld, v, what="steps")
    if x > MAX_STEPS:
        raise ConfigError(fld, f"must be <= {MAX_STEPS:.0e} (steps are stored as int64), got {v!r}")
    return x


def _fpr(fld, v) -> float:
    v = _number(fld, v)
    if not (0.0 < v < 1.0):
        raise ConfigError(fld, f"false-positive rate must be in (0, 1), got {v!r}")
    return v


def _fprs(fld: str, spec) -> tuple:
    """``grid.fpr``: a list, one value or a generator of false-positive rates in (0, 1)."""
    if isinstance(spec, (list, tuple)) and not spec:
        raise ConfigError(fld, "is empty (leave grid.fpr out for no TPR metric)")
    raw = _expand(fld, spec, numeric=True)
    if not raw:
        raise ConfigError(fld, "is empty (leave grid.fpr out for no TPR metric)")
    vals = tuple(_fpr(f"{fld}[{i}]", v) for i, v in enumerate(raw))
    seen = {}
    for i, v in enumerate(vals):
        if v in seen:
            raise ConfigError(f"{fld}[{i}]", f"duplicate value {v!r} (also at index {seen[v]})")
        seen[v] = i
    return vals


def _choice(options):
    def check(fld, v):
        if not isinstance(v, str) or v not in options:
            raise ConfigError(fld, f"unknown value {v!r} (choose from {', '.join(options)})")
        return v
    return check


AXIS_CHECKS = {
    "sigma": _positive,
    "q": _q,
    "steps": _steps,
    "delta": _delta,
    "sampling": _choice(SAMPLINGS),
    "relation": _choice(RELATIONS),
}


def _expand(fld: str, spec, numeric: bool) -> list:
    """A list, a scalar, or a generator mapping -> list of raw values."""
    if isinstance(spec, dict):
        if not numeric:
            raise ConfigError(fld, "give a list of names (generators are for numeric axes)")
        if len(spec) != 1:
            raise ConfigError(fld, f"a generator is a mapping with one key ({' or '.join(GENERATORS)}), "
                                   f"got {sorted(spec)}")
        (kind, args), = spec.items()
        if kind not in GENERATORS:
            raise ConfigError(fld, f"unknown generator {kind!r} (use {' or '.join(GENERATORS)})")
        if not isinstance(args, (list, tuple)) or len(args) != 3:
            raise ConfigError(f"{fld}.{kind}", "needs [start, stop, num]")
        start = _number(f"{fld}.{kind}[0]", args[0])
        stop = _number(f"{fld}.{kind}[1]", args[1])
        num = args[2]
        if isinstance(num, bool) or not isinstance(num, numbers.Integral) or num < 0:
            raise ConfigError(f"{fld}.{kind}[2]", f"num must be an integer >= 0, got {num!r}")
        if kind == "geomspace":
            if start <= 0 or stop <= 0:
                raise ConfigError(f"{fld}.geomspace", f"start and stop must be > 0, got {start!r}, {stop!r}")
            vals = np.geomspace(start, stop, int(num))
        else:
            vals = np.linspace(start, stop, int(num))
        return [float(x) for x in vals]
    if isinstance(spec, (list, tuple)):
        return list(spec)
    if spec is None:
        raise ConfigError(fld, "is empty")
    return [spec]


def _axis(fld: str, name: str, spec, check=None) -> tuple:
    numeric = name not in ("sampling", "relation")
    generated = isinstance(spec, dict)
    raw = _expand(fld, spec, numeric)
    check = check or AXIS_CHECKS[name]
    vals = []
    for i, v in enumerate(raw):
        if name == "steps" and generated:
            # generated step counts are rounded to integers (and deduplicated below)
            x = _number(f"{fld}[{i}]", v)
            v = int(round(x))
        vals.append(check(f"{fld}[{i}]", v))
    if not vals:
        raise ConfigError(fld, "is empty (the grid would have no cells)")
    if name == "steps" and generated:
        vals = sorted(set(vals))
    seen = {}
    for i, v in enumerate(vals):
        if v in seen:
            raise ConfigError(f"{fld}[{i}]", f"duplicate value {v!r} (also at index {seen[v]})")
        seen[v] = i
    return tuple(vals)


def _options(methods: tuple[str, ...], spec, variants: dict | None = None) -> dict:
    from .methods import validate_options

    variants = variants or {}

    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ConfigError("options", f"must be a mapping method -> {{option: value}}, got {type(spec).__name__}")
    for m in spec:
        if m not in methods:
            raise ConfigError(f"options.{m}", f"method {m!r} is not in methods ({', '.join(methods)})")
    out = {}
    for m in methods:
        given = spec.get(m) or {}
        if not isinstance(given, dict):
            raise ConfigError(f"options.{m}", f"must be a mapping option -> value, got {given!r}")
        if "variant_of" in given:
            raise ConfigError(f"options.{m}.variant_of", "is set from variants:, not given as an option")
        out[m] = validate_options(variants.get(m, m), f"options.{m}", given)
        if m in variants:
            out[m]["variant_of"] = variants[m]
    return out


def _quick_variant(data: dict) -> dict:
    """``data`` with its ``quick:`` overrides applied (errors name ``quick.<field>``)."""
    q = data.get("quick")
    if not isinstance(q, dict) or not q:
        raise ConfigError("quick", "must be a non-empty mapping (keys: " + ", ".join(QUICK_KEYS) + ")")
    for k in q:
        if k not in QUICK_KEYS:
            raise ConfigError(f"quick.{k}", f"unknown key (known: {', '.join(QUICK_KEYS)})")
    out = {k: v for k, v in data.items() if k != "quick"}
    if "grid" in q:
        if not isinstance(q["grid"], dict):
            raise ConfigError("quick.grid", "must be a mapping axis -> values")
        for k in q["grid"]:
            if k not in AXES + GRID_EXTRA:
                raise ConfigError(f"quick.grid.{k}", f"unknown axis (known: {', '.join(AXES + GRID_EXTRA)})")
        grid = dict(out.get("grid") or {})
        for k, v in q["grid"].items():
            if k in ("sampling", "relation") and k in out:
                out[k] = v
            else:
                grid[k] = v
        out["grid"] = grid
    if "methods" in q:
        out["methods"] = q["methods"]
    if "options" in q:
        if not isinstance(q["options"], dict):
            raise ConfigError("quick.options", "must be a mapping method -> {option: value}")
        opts = {m: dict(v or {}) for m, v in (out.get("options") or {}).items()}
        for m, v in q["options"].items():
            if not isinstance(v, dict):
                raise ConfigError(f"quick.options.{m}", f"must be a mapping option -> value, got {v!r}")
            opts.setdefault(m, {}).update(v)
        out["options"] = opts
    if "description" in q:
        out["description"] = q["description"]
    name = out.get("name")
    if isinstance(name, str) and name.strip():
        out["name"] = f"{name.strip()}-quick"
    if "store" in q:
        out["store"] = q["store"]
    elif isinstance(data.get("store"), str):
        st = data["store"].rstrip("/")
        out["store"] = st[:-5] + "_quick.zarr" if st.endswith(".zarr") else st + "_quick"
    samp = out.get("sampling", (out.get("grid") or {}).get("sampling"))
    if not (samp in SIZED or (isinstance(samp, (list, tuple)) and set(SIZED) & set(samp))):
        for k in TRUNCATION_KEYS:  # (a quick variant without the scheme: its settings are not needed)
            out.pop(k, None)
    if not (samp == ALLOCATION or (isinstance(samp, (list, tuple)) and ALLOCATION in samp)):
        out.pop("selections", None)
    methods = out.get("methods")
    if isinstance(methods, list) and isinstance(out.get("options"), dict):
        # options of methods the quick variant leaves out are dropped, not an error
        out["options"] = {m: v for m, v in out["options"].items() if m in methods}
    return out


def parse_config(data: Any, source: str | None = None, quick: bool = False) -> SweepConfig:
    """Validate already-loaded YAML data (a mapping) into a :class:`SweepConfig`.

    ``quick``: apply the config's ``quick:`` section (see the module doc).
    """
    from pldlib.plugins import load_plugins

    from .methods import check_available, method_names

    try:
        load_plugins()  # mechanisms and methods named in $PLDLIB_PLUGINS
    except ImportError as e:
        raise ConfigError("PLDLIB_PLUGINS", str(e).removeprefix("PLDLIB_PLUGINS: ")) from None

    if not isinstance(data, dict):
        raise ConfigError("config", f"must be a mapping of keys (name, grid, ...), got {type(data).__name__}")
    if "kind" in data:  # the retired table configs had one; say so instead of "unknown key"
        if data.get("kind") == "sigma_table":
            raise ConfigError("kind", "sigma_table configs are retired: sigma look-ups now invert an ordinary "
                                      "sweep (an atlas: configs/atlas.yaml, then python -m sweeps.atlas export)")
        raise ConfigError("kind", f"unknown key (a sweep config has no kind:; got {data['kind']!r})")
    for k in data:
        if k not in TOP_KEYS:
            raise ConfigError(str(k), f"unknown key (known: {', '.join(TOP_KEYS)})")
    if quick and "quick" not in data:
        raise ConfigError("quick", "--quick given but the config has no quick: section")
    if quick:
        variant = _quick_variant(data)
        if not data.get("name") and source:
            variant["name"] = f"{Path(source).stem}-quick"
        return parse_config(variant, source=source)
    stem = Path(source).stem if source else "sweep"
    name = data.get("name", stem)
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("name", f"must be a non-empty string, got {name!r}")
    description = data.get("description", "") or ""
    if not isinstance(description, str):
        raise ConfigError("description", "must be a string")
    store = data.get("store", f"results/{name}.zarr")
    if not isinstance(store, str) or not store.strip():
        raise ConfigError("store", f"must be a path or URL string, got {store!r}")
    mechanism_default = "mechanism" not in data
    mechanism = data.get("mechanism", DEFAULT_MECHANISM)
    known_mechs = mechanism_names() + (BANDMF,)
    if not isinstance(mechanism, str) or mechanism.lower() not in known_mechs:
        raise ConfigError("mechanism", f"unknown mechanism {mechanism!r} (choose from {', '.join(known_mechs)})")
    mechanism = mechanism.lower()

    variants = data.get("variants") or {}
    if not isinstance(variants, dict):
        raise ConfigError("variants", f"must be a mapping name -> method, got {type(variants).__name__}")
    for alias, base in variants.items():
        if not isinstance(alias, str) or not alias.strip() or alias in method_names():
            raise ConfigError(f"variants.{alias}", "must be a new name (not an existing method)")
        if not isinstance(base, str) or base not in method_names():
            raise ConfigError(f"variants.{alias}", f"unknown method {base!r} (available: "
                                                   f"{', '.join(method_names())})")
    methods = data.get("methods", ["pld"])
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, list) or not methods:
        raise ConfigError("methods", "must be a non-empty list of method names")
    known = method_names() + tuple(sorted(variants))
    for i, m in enumerate(methods):
        if not isinstance(m, str) or m not in known:
            raise ConfigError(f"methods[{i}]", f"unknown method {m!r} (available: {', '.join(known)})")
        check_available(f"methods[{i}]", variants.get(m, m))
    if len(set(methods)) != len(methods):
        raise ConfigError("methods", f"duplicate method in {methods}")
    methods = tuple(methods)

    grid = data.get("grid")
    if grid is None:
        raise ConfigError("grid", "missing (give at least sigma, steps and delta)")
    if not isinstance(grid, dict):
        raise ConfigError("grid", f"must be a mapping axis -> values, got {type(grid).__name__}")
    grid = dict(grid)
    for k in grid:
        if k not in AXES + GRID_EXTRA:
            raise ConfigError(f"grid.{k}", f"unknown axis (known: {', '.join(AXES + GRID_EXTRA)})")
    fpr = _fprs("grid.fpr", grid.pop("fpr")) if "fpr" in grid else ()
    for k in ("sampling", "relation"):  # also accepted at top level
        if k in data:
            if k in grid:
                raise ConfigError(k, f"given both at top level and in grid.{k}")
            grid[k] = data[k]
    defaults = {"q": [1.0], "sampling": ["none"], "relation": ["add_remove"]}
    bandmf = mechanism == BANDMF
    checks = {"sampling": _choice(BANDMF_SAMPLINGS), "relation": _choice(BANDMF_RELATIONS)} if bandmf else {}
    axes = {}
    for a in AXES:
        if a not in grid:
            if bandmf and a in ("sampling", "q"):
                raise ConfigError(f"grid.{a}", "missing (mechanism bandmf needs the batch selections and the "
                                               "expected batch fraction q)")
            if a in defaults:
                grid[a] = defaults[a]
            else:
                raise ConfigError(f"grid.{a}", "missing (required axis)")
        fld = f"grid.{a}" if a in (data.get("grid") or {}) or a not in data else a
        axes[a] = _axis(fld, a, grid[a], checks.get(a))
    if "none" in axes["sampling"]:
        small = [q for q in axes["q"] if q < 1.0]
        if small:
            raise ConfigError("grid.sampling", f"'none' needs q = 1 but grid.q has {small[0]!r}; use "
                                               "poisson or wor for q < 1 (with q = 1 they equal 'none')")
    truncation = _truncation(data, axes, mechanism)
    selections = _selections(data, axes, mechanism)
    report = _report(data.get("report"))
    options = _options(methods, data.get("options"), variants)
    variants = {a: b for a, b in variants.items() if a in methods}
    bands = ()
    if bandmf:
        methods, options, variants, bands = _bandmf(data, axes, methods, options, variants, fpr, report)
    elif data.get("bands") is not None:
        raise ConfigError("bands", f"only with mechanism {BANDMF} (this config's is {mechanism})")
    if "quick" in data:  # the quick variant must be valid too (errors name quick.<field>)
        try:
            parse_config(_quick_variant(data), source=source)
        except ConfigError as e:
            if e.field.startswith("quick"):
                raise
            raise ConfigError(f"quick.{e.field}", e.problem) from None
    layout = _layout(data.get("layout"))
    task_seconds = None
    if data.get("task_seconds") is not None:
        task_seconds = _positive("task_seconds", data["task_seconds"])
    return SweepConfig(name=name.strip(), store=store.strip(), mechanism=mechanism, methods=methods,
                       options=options, description=description, source=source, variants=variants,
                       report=report, fpr=fpr, mechanism_default=mechanism_default, **axes, **truncation,
                       selections=selections, layout=layout, task_seconds=task_seconds, bands=bands)


def _bandmf(data: dict, axes: dict, methods: tuple, options: dict, variants: dict, fpr, report):
    """``mechanism: bandmf``: the validated ``bands`` (an integer or a list, default 1), each method
    expanded into one variant per band count (``pld@b4``: ``pld`` with option ``bands: 4``), and
    every (q, sampling, bands) checked reachable (:func:`pldlib.correlated.bandmf_scheme_args`)."""
    from pldlib.correlated import bandmf_scheme_args
    from pldlib.methods import method_info

    raw = data.get("bands", 1)
    raw = raw if isinstance(raw, (list, tuple)) else [raw]
    if not raw:
        raise ConfigError("bands", "is empty (give one or more band counts, 1 for DP-SGD)")
    bands = tuple(_checked(V.int_at_least, f"bands[{i}]" if len(raw) > 1 else "bands", b, 1)
                  for i, b in enumerate(raw))
    if len(set(bands)) != len(bands):
        raise ConfigError("bands", f"duplicate band count in {list(bands)}")
    if fpr:
        raise ConfigError("grid.fpr", f"the TPR metric is not available for mechanism {BANDMF}")
    if report.get("tradeoff_curve"):
        raise ConfigError("report.tradeoff_curve", f"not available for mechanism {BANDMF}")
    for i, m in enumerate(methods):
        if method_info(variants.get(m, m)).kind != "certified":
            raise ConfigError(f"methods[{i}]", f"mechanism {BANDMF} is accounted by certified methods only "
                                               f"(pld, prv, spa), got {m!r}")
    for b in bands:
        for s in axes["sampling"]:
            for q in axes["q"]:
                try:
                    bandmf_scheme_args(s, q, b)
                except ValueError as e:
                    raise ConfigError("grid.q", f"{e} (sampling {s}, bands {b})".removeprefix("q: ")) from None
    new_methods, new_options, new_variants = [], {}, {}
    for m in methods:
        for b in bands:
            alias = f"{m}@b{b}"
            new_methods.append(alias)
            base = variants.get(m, m)
            new_variants[alias] = base
            new_options[alias] = {**options[m], "bands": b, "variant_of": base}
    return tuple(new_methods), new_options, new_variants, bands


def _layout(spec):
    """The validated ``layout:`` of a config: None / "auto" (automatic), "blocks", "sharded" or
    ``{shard_blocks: N}`` (N >= 1 blocks per shard); see :mod:`sweeps.shards`."""
    if spec is None or spec == "auto":
        return None
    if spec in ("blocks", "sharded"):
        return spec
    if isinstance(spec, dict):
        for k in spec:
            if k != "shard_blocks":
                raise ConfigError(f"layout.{k}", "unknown key (known: shard_blocks)")
        n = spec.get("shard_blocks")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError("layout.shard_blocks", f"must be an integer >= 1, got {n!r}")
        return {"shard_blocks": n}
    raise ConfigError("layout", f"must be auto, blocks, sharded or {{shard_blocks: N}}, got {spec!r}")


def _selections(data: dict, axes: dict, mechanism: str) -> int | None:
    """The validated top-level ``selections`` (an integer >= 1; None when absent or 1): k > 1 needs
    ``random_allocation`` on the sampling axis (ConfigError naming it)."""
    if data.get("selections") is None:
        return None
    k = _checked(V.int_at_least, "selections", data["selections"], 1)
    if k == 1:
        return None
    if ALLOCATION not in axes["sampling"]:
        raise ConfigError("selections", f"k > 1 only with sampling {ALLOCATION} (the sampling axis has "
                                        f"{', '.join(axes['sampling'])})")
    return k


def _truncation(data: dict, axes: dict, mechanism: str) -> dict:
    """The validated top-level ``batch_size`` and ``dataset_size`` (integers >= 1): required when the
    sampling axis holds ``truncated_poisson`` or ``with_replacement``, refused otherwise (ConfigError
    naming the field).  With ``with_replacement`` the q axis must be batch_size / dataset_size."""
    fld = "grid.sampling" if "sampling" in (data.get("grid") or {}) else "sampling"
    out = {}
    sized = [s for s in SIZED if s in axes["sampling"]]
    if not sized:
        for k in TRUNCATION_KEYS:
            if k in data:
                raise ConfigError(k, f"only with sampling {TRUNCATED} or {WITH_REPLACEMENT} (the sampling axis "
                                     f"has {', '.join(axes['sampling'])})")
        return out
    if mechanism != "gaussian":
        raise ConfigError(fld, f"{sized[0]} is implemented for the gaussian mechanism only, not {mechanism}")
    what = {"batch_size": "the batch size B", "dataset_size": "the number n of records"}
    for k in TRUNCATION_KEYS:
        if k not in data or data[k] is None:
            raise ConfigError(k, f"required with sampling {sized[0]} ({what[k]}; a top-level integer >= 1)")
        out[k] = _checked(V.int_at_least, k, data[k], 1)
    if WITH_REPLACEMENT in sized:
        if out["dataset_size"] < 2:
            raise ConfigError("dataset_size", f"must be at least 2 with sampling {WITH_REPLACEMENT}, got "
                                              f"{out['dataset_size']}")
        rate = out["batch_size"] / out["dataset_size"]
        off = [q for q in axes["q"] if abs(q - rate) > 1e-9 * rate]
        if off:
            qf = "grid.q" if "q" in (data.get("grid") or {}) or "q" not in data else "q"
            raise ConfigError(qf, f"with sampling {WITH_REPLACEMENT} q is batch_size / dataset_size = "
                                  f"{out['batch_size']}/{out['dataset_size']} = {rate:.6g}, but the axis has "
                                  f"{off[0]!r}")
    return out


#: keys of ``report.tradeoff_curve`` and their defaults (the DP-SGD headline configuration)
TRADEOFF_CURVE_DEFAULTS = {"sigma": 1.0, "q": 0.01, "steps": 10000, "sampling": "poisson",
                           "relation": "add_remove", "delta": 1e-5}


def _report(report) -> dict:
    """Validate the ``report:`` section (settings of ``sweeps report``, not in the fingerprint)."""
    report = report or {}
    if not isinstance(report, dict):
        raise ConfigError("report", f"must be a mapping (keys: {', '.join(REPORT_KEYS)})")
    for k in report:
        if k not in REPORT_KEYS:
            raise ConfigError(f"report.{k}", f"unknown key (known: {', '.join(REPORT_KEYS)})")
    out = {}
    if "eps_targets" in report:
        t = report["eps_targets"]
        if not isinstance(t, list) or not t:
            raise ConfigError("report.eps_targets", "must be a non-empty list of epsilons > 0")
        out["eps_targets"] = [_positive(f"report.eps_targets[{i}]", v) for i, v in enumerate(t)]
    if "tradeoff_curve" in report:
        out["tradeoff_curve"] = tradeoff_curve_spec(report["tradeoff_curve"], "report.tradeoff_curve")
    return out


def tradeoff_curve_spec(spec, fld: str = "report.tradeoff_curve") -> dict:
    """A validated ``report.tradeoff_curve`` (``true`` or ``{}``: the DP-SGD headline
    configuration, sigma 1, q 0.01, 10,000 steps, Poisson, add_remove, delta 1e-5)."""
    if spec is True or spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ConfigError(fld, "must be true or a mapping with keys " + ", ".join(TRADEOFF_CURVE_DEFAULTS))
    for k in spec:
        if k not in TRADEOFF_CURVE_DEFAULTS:
            raise ConfigError(f"{fld}.{k}", f"unknown key (known: {', '.join(TRADEOFF_CURVE_DEFAULTS)})")
    out = {**TRADEOFF_CURVE_DEFAULTS, **spec}
    checks = {"sigma": _positive, "q": _q, "steps": _steps, "delta": _delta,
              "sampling": _choice(SAMPLINGS), "relation": _choice(RELATIONS)}
    out = {k: checks[k](f"{fld}.{k}", v) for k, v in out.items()}
    if out["sampling"] == "none" and out["q"] < 1.0:
        raise ConfigError(f"{fld}.sampling", "'none' needs q = 1; use poisson or wor for q < 1")
    if out["sampling"] in SIZED:
        raise ConfigError(f"{fld}.sampling", f"{out['sampling']} is not available for the trade-off curve plot "
                                             "(it has no batch_size or dataset_size)")
    return out


def load_config(path: str | os.PathLike, quick: bool = False) -> SweepConfig:
    """Read and validate a YAML config file (``quick``: its ``quick:`` variant)."""
    return parse_config(read_config_data(path), source=str(Path(path)), quick=quick)


def read_config_data(path: str | os.PathLike):
    """The YAML data of a config file, unvalidated (ConfigError if unreadable or not YAML)."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError("config", f"cannot read {str(p)!r}: {reason}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        at = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError("config", f"{str(p)!r} is not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None
    return data


def check_store_writable(store: str) -> None:
    """Raise ConfigError('store', ...) unless ``store`` can be created or written.

    Local paths are checked by trying, never by permission bits (root passes every
    ``os.access`` check, yet cannot create anything in ``/proc`` or ``/sys``): a probe
    directory is created and removed in the store, or in its nearest existing parent
    when the store does not exist yet.  URLs (``s3://...``) are left to fsspec.
    """
    if "://" in store and not store.startswith("file://"):
        return
    import tempfile

    p = Path(store.removeprefix("file://")).expanduser()
    try:
        exists = p.exists()
        if exists and not p.is_dir():
            raise ConfigError("store", f"{str(p)!r} exists and is not a directory (a zarr store is one)")
        target = p if exists else p.absolute().parent
        while not target.exists():
            target = target.parent
        if not target.is_dir():
            raise ConfigError("store", f"cannot create {str(p)!r}: {str(target)!r} is not a directory")
    except OSError as e:  # e.g. a path component that cannot be looked at
        raise ConfigError("store", f"cannot use {str(p)!r}: {e.strerror or e}") from None
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".sweeps-probe-", dir=target))  # sweeps.store.PROBE_PREFIX
    except OSError as e:
        why = e.strerror or type(e).__name__
        if exists:
            raise ConfigError("store", f"{str(p)!r} is not writable ({why})") from None
        raise ConfigError("store", f"cannot create {str(p)!r}: {str(target)!r} is not writable ({why})") from None
