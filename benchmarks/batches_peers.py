"""Batch samplers beside their peers: two more parts of results/BATCHES.md, cached as JSON in
results/batches/ and rendered by :mod:`benchmarks.batches`:

* ``truncated`` -- truncated Poisson batches (a capped batch size, docs/MATH.md 2.6): the
  certified interval here beside dp_accounting's ``PLDAccountant`` on the same
  ``TruncatedSubsampledGaussianDpEvent`` (its value and time, measured side by side), and the
  uncapped Poisson interval for the cost of the cap;
* ``allocation`` -- random allocation (one step of t per epoch, several epochs) beside
  Feldman and Shenfeld's ``PLD_accounting`` package (``gaussian_allocation_epsilon_range``: its
  upper and lower bounds at its default accuracy, with numba), same shapes, value and time in
  the same run; k-of-t shapes (k > 1) where only it answers;
* ``saving`` -- the certified noise saving of random allocation (one batch per step, each record
  in exactly one step per epoch) over Poisson sampling at the same expected batch size and the
  same certified epsilon, on five DP-SGD shapes: sigma calibrated on each scheme's certified
  upper bound, and, for the true saving's other side, the sigma below which random
  allocation's certified *lower* bound already exceeds the target.

Run: ``python -m benchmarks.batches_peers [--part truncated|allocation|saving|all]``, then
``python -m benchmarks.batches --render``.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import warnings

import pldlib
from pldlib import events as E

from .batches import CACHE, DELTA, _f

#: (q, dataset size, batch cap, sigma, steps): caps from the mean batch (q n) to 1.5x it
TRUNCATED = [(0.01, 10_000, b, s, 1000) for s in (0.8, 1.0, 2.0) for b in (100, 110, 120, 150)]

#: (sigma, t, epochs, k selections per epoch): random allocation shapes (k > 1: the peer only)
ALLOCATION = [(1.0, 100, 10, 1), (2.0, 100, 10, 1), (1.0, 100, 100, 1), (1.0, 1000, 1, 1), (0.8, 1000, 1, 1),
              (0.7, 10000, 1, 1), (1.0, 100, 10, 2), (1.0, 100, 10, 4)]

#: (t = 1/q, epochs, target eps at delta 1e-5): DP-SGD shapes
SAVING = [(100, 100, 8.0), (100, 10, 3.0), (1000, 10, 1.0), (1000, 100, 4.0), (256, 50, 2.0)]


def run_truncated() -> list[dict]:
    from dp_accounting import dp_event as D
    from dp_accounting.pld import pld_privacy_accountant as P

    from pldlib.methods.pld import PLDAccountant

    rows = []
    for q, n, b, s, k in TRUNCATED:
        ev = E.TruncatedPoissonGaussianEvent(s, q, n, b)
        t0 = time.perf_counter()
        iv = PLDAccountant("add_remove").compose(ev, k).epsilon(DELTA)
        ours_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        theirs = P.PLDAccountant()
        theirs.compose(D.TruncatedSubsampledGaussianDpEvent(n, q, b, s), k)
        their = theirs.get_epsilon(DELTA)
        their_s = time.perf_counter() - t0
        plain = PLDAccountant("add_remove").compose(E.Sampled(E.GaussianEvent(s), q), k).epsilon(DELTA)
        rows.append({"q": q, "n": n, "batch_cap": b, "sigma": s, "steps": k, "cut_probability": ev.truncation_probability,
                     "lower": iv.lower, "upper": iv.upper, "seconds": ours_s, "dp_accounting": their,
                     "dp_accounting_seconds": their_s, "poisson_lower": plain.lower, "poisson_upper": plain.upper})
        print(rows[-1], flush=True)
    return rows


def _clear_caches() -> None:
    """Empty pldlib's in-process caches of random-allocation pairs (shared across calls)."""
    from pldlib.sampling import allocation

    for obj in vars(allocation).values():
        if callable(getattr(obj, "cache_clear", None)):
            obj.cache_clear()


def run_allocation() -> list[dict]:
    from PLD_accounting import gaussian_allocation_epsilon_range, has_numba

    rows = []
    for s, t, epochs, k in ALLOCATION:
        row = {"sigma": s, "t": t, "epochs": epochs, "k": k, "numba": bool(has_numba())}
        if k == 1:
            _clear_caches()  # (each shape timed from scratch, as the peer is)
            t0 = time.perf_counter()
            iv = pldlib.account(pldlib.Gaussian(s, q=1.0 / t, sampling="random_allocation"), steps=t * epochs).epsilon(DELTA)
            row.update(lower=iv.lower, upper=iv.upper, seconds=time.perf_counter() - t0)
        t0 = time.perf_counter()
        up, lo = gaussian_allocation_epsilon_range(delta=DELTA, sigma=s, num_steps=t, num_selected=k, num_epochs=epochs)
        row.update(peer_lower=float(lo), peer_upper=float(up), peer_seconds=time.perf_counter() - t0)
        rows.append(row)
        print(row, flush=True)
    return rows


def _sigma_where_lower_exceeds(make, eps, delta, hi, tol=1e-3, reach=0.8):
    """A sigma below ``hi`` at which the certified *lower* bound on eps(delta) still exceeds ``eps``
    (so no accountant can certify ``eps`` at that sigma or less noise), the largest found by
    walking down from ``hi`` in 1% steps to ``reach * hi`` and bisecting the last step; None
    if none in that range (the lower bound there is too weak to say)."""
    prev, sig = hi, hi
    while sig > reach * hi:
        sig *= 0.99
        if make(sig).epsilon(delta).lower > eps:
            lo, up = sig, prev
            while up / lo - 1 > tol:
                mid = math.sqrt(lo * up)
                if make(mid).epsilon(delta).lower > eps:
                    lo = mid
                else:
                    up = mid
            return lo
        prev = sig
    return None


def run_saving() -> list[dict]:
    rows = []
    for t, epochs, eps in SAVING:
        q, steps = 1.0 / t, t * epochs
        t0 = time.perf_counter()
        pois = pldlib.calibrate(eps, DELTA, q, steps, sampling="poisson")
        tp = time.perf_counter() - t0
        t0 = time.perf_counter()
        ra = pldlib.calibrate(eps, DELTA, q, steps, sampling="random_allocation")
        tr = time.perf_counter() - t0

        def make(sig):
            return pldlib.account(pldlib.Gaussian(sig, q=q, sampling="random_allocation"), steps=steps)

        ra_floor = _sigma_where_lower_exceeds(make, eps, DELTA, ra.sigma)
        rows.append({"t": t, "epochs": epochs, "steps": steps, "eps": eps, "sigma_poisson": pois.sigma,
                     "sigma_poisson_lower": pois.sigma_lower, "sigma_ra": ra.sigma, "sigma_ra_floor": ra_floor,
                     "seconds_poisson": tp, "seconds_ra": tr,
                     "saving_certified": 1.0 - ra.sigma / pois.sigma,
                     "saving_at_most": None if ra_floor is None else 1.0 - ra_floor / (pois.sigma_lower or pois.sigma)})
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", choices=["truncated", "allocation", "saving", "all"])
    a = ap.parse_args(argv)
    CACHE.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    for part, fn in (("truncated", run_truncated), ("allocation", run_allocation), ("saving", run_saving)):
        if a.part in (part, "all"):
            rows = fn()
            (CACHE / f"{part}.json").write_text(json.dumps(rows, indent=1, default=_f))


if __name__ == "__main__":
    main()
