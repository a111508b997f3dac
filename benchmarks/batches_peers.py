"""Batch samplers beside their peers: two more parts of results/BATCHES.md, cached as JSON in
results/batches/ and rendered by :mod:`benchmarks.batches`:

* ``truncated`` -- truncated Poisson batches (a capped batch size, docs/MATH.md 2.6): the
  certified interval here beside dp_accounting's ``PLDAccountant`` on the same
  ``TruncatedSubsampledGaussianDpEvent`` (its value and time, measured side by side), and the
  uncapped Poisson interval for the cost of the cap;
* ``allocation`` -- random allocation (k of the t steps per epoch, several epochs) beside
  Feldman and Shenfeld's ``PLD_accounting`` package (``gaussian_allocation_epsilon_range``: its
  upper and lower bounds at its default accuracy, with numba), same shapes, value and time in
  the same run, and Poisson sampling at the same rate q = k/t;
* ``kmc`` -- Monte Carlo soundness of k of t random allocation (k > 1): 10^7 samples per
  direction of the exact pair (docs/MATH.md 13.8) against the certified interval;
* ``noise`` -- random allocation with Laplace noise, randomized response and an (eps, delta) step
  (docs/MATH.md 13.9) beside Poisson sampling and the unamplified bound, and Monte Carlo of the
  Laplace pair at 10^7 samples per direction;
* ``saving`` -- the certified noise saving of random allocation (one batch per step, each record
  in exactly one, or k, of the steps of each epoch) over Poisson sampling at the same expected batch size and the
  same certified epsilon, on five DP-SGD shapes: sigma calibrated on each scheme's certified
  upper bound, and, for the true saving's other side, the sigma below which random
  allocation's certified *lower* bound already exceeds the target.

Run: ``python -m benchmarks.batches_peers [--part truncated|allocation|kmc|noise|saving|all]``, then
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

#: (sigma, t, epochs, k selections per epoch): random allocation shapes
ALLOCATION = [(1.0, 100, 10, 1), (2.0, 100, 10, 1), (1.0, 100, 100, 1), (1.0, 1000, 1, 1), (0.8, 1000, 1, 1),
              (0.7, 10000, 1, 1), (1.0, 100, 10, 2), (1.0, 100, 10, 4), (2.0, 100, 10, 2), (1.0, 100, 10, 8),
              (1.0, 256, 10, 2), (1.0, 1000, 1, 4)]

#: (noise, parameter, t, epochs): random allocation with noises other than Gaussian
NOISE = [("laplace", b, t, e) for b in (0.5, 1.0, 2.0) for t, e in ((100, 10), (1000, 1))] + \
        [("rr", 1.0, 100, 10), ("rr", 2.0, 100, 10), ("approx_dp", 1.0, 100, 10)]
#: (b, t, epochs): Monte Carlo cases of random allocation with Laplace noise (three eps each)
NOISE_MC = [(1.0, 4, 1), (1.0, 4, 10), (1.0, 16, 1), (1.0, 16, 10)]

#: (t, k, sigma, epochs): Monte Carlo cases of k of t random allocation (three eps each)
KMC = [(3, 2, 1.0, 1), (4, 2, 0.8, 1), (6, 3, 1.5, 3), (8, 3, 0.8, 5), (20, 5, 1.0, 4), (16, 4, 1.5, 10)]

#: (t = 1/q, epochs, target eps at delta 1e-5): DP-SGD shapes
SAVING = [(100, 100, 8.0), (100, 10, 3.0), (1000, 10, 1.0), (1000, 100, 4.0), (256, 50, 2.0)]
#: (t, epochs, target eps, k): k of t shapes (each record in k of the t steps, Poisson at q = k/t)
SAVING_K = [(100, 10, 4.0, 2), (100, 10, 8.0, 4), (1000, 10, 2.0, 4), (256, 50, 4.0, 2)]


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
        _clear_caches()  # (each shape timed from scratch, as the peer is)
        t0 = time.perf_counter()
        iv = pldlib.account(pldlib.Gaussian(s, q=k / t, sampling="random_allocation", selections=k),
                            steps=t * epochs).epsilon(DELTA)
        row.update(lower=iv.lower, upper=iv.upper, seconds=time.perf_counter() - t0)
        pois = pldlib.account(pldlib.Gaussian(s, q=k / t, sampling="poisson"), steps=t * epochs).epsilon(DELTA)
        row.update(poisson_lower=pois.lower, poisson_upper=pois.upper)
        t0 = time.perf_counter()
        up, lo = gaussian_allocation_epsilon_range(delta=DELTA, sigma=s, num_steps=t, num_selected=k, num_epochs=epochs)
        row.update(peer_lower=float(lo), peer_upper=float(up), peer_seconds=time.perf_counter() - t0)
        rows.append(row)
        print(row, flush=True)
    return rows


def run_kmc(samples: int = 10_000_000) -> list[dict]:
    """k of t random allocation: seeded Monte Carlo of the exact pair (Hoeffding, beta = 1e-3 per
    case) against the certified interval of the PLD accountant."""
    import numpy as np

    from pldlib.testing.montecarlo import allocation_delta

    rows = []
    for t, k, s, epochs in KMC:
        eps = np.array([0.1, 0.4, 1.0]) * math.sqrt(epochs * k) / s
        t0 = time.perf_counter()
        mc = allocation_delta(s, t, epochs, eps, n_samples=samples, seed=9000 + 100 * t + 10 * k + epochs,
                              selections=k, chunk=50_000)
        mc_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        iv = pldlib.account(pldlib.Gaussian(s, q=k / t, sampling="random_allocation", selections=k),
                            steps=t * epochs).delta(eps)
        ours_s = time.perf_counter() - t0
        for j, e in enumerate(eps):
            est = max(mc.remove[j], mc.add[j])
            rows.append({"t": t, "k": k, "sigma": s, "epochs": epochs, "eps": float(e), "lower": float(iv.lower[j]),
                         "upper": float(iv.upper[j]), "estimate": float(est), "eta": mc.eta,
                         "se": float(max(mc.se_remove[j], mc.se_add[j])), "samples": samples,
                         "mc_seconds": mc_s, "seconds": ours_s,
                         "inside": bool(iv.lower[j] <= est + mc.eta and est - mc.eta <= iv.upper[j])})
            print(rows[-1], flush=True)
    return rows


def _noise_event(name: str, x: float):
    return {"laplace": lambda: E.LaplaceEvent(x), "rr": lambda: E.RandomizedResponseEvent(x),
            "approx_dp": lambda: E.ApproxDPEvent(x, 1e-8)}[name]()


def run_noise(samples: int = 10_000_000) -> dict:
    """Random allocation with Laplace noise, randomized response and an (eps, 1e-8) step (docs/MATH.md
    13.9): the certified interval beside Poisson sampling at the same rate (where pldlib has it) and
    beside the unamplified bound (the noise's pair once per epoch); then seeded Monte Carlo of the
    exact Laplace pair against the certified interval."""
    import numpy as np

    from pldlib.methods.pld import PLDAccountant
    from pldlib.testing.montecarlo import laplace_allocation_delta

    rows = []
    for name, x, t, epochs in NOISE:
        ev = _noise_event(name, x)
        _clear_caches()
        t0 = time.perf_counter()
        iv = PLDAccountant("add_remove").compose(E.Sampled(ev, 1.0 / t, "random_allocation"), t * epochs).epsilon(DELTA)
        secs = time.perf_counter() - t0
        row = {"noise": name, "parameter": x, "t": t, "epochs": epochs, "lower": iv.lower, "upper": iv.upper,
               "seconds": secs}
        try:
            pois = PLDAccountant("add_remove").compose(E.Sampled(ev, 1.0 / t, "poisson"), t * epochs).epsilon(DELTA)
            row.update(poisson_lower=pois.lower, poisson_upper=pois.upper)
        except Exception as e:  # (no Poisson pair for a finite pair without a shift family)
            row["poisson"] = type(e).__name__
        try:
            un = PLDAccountant("add_remove").compose(ev, epochs).epsilon(DELTA)
            row.update(unamplified_lower=un.lower, unamplified_upper=un.upper)
        except Exception as e:
            row["unamplified"] = f"{type(e).__name__}: {e}"
        rows.append(row)
        print(row, flush=True)
    mc_rows = []
    for b, t, epochs in NOISE_MC:
        eps = np.array([0.1, 0.4, 1.0]) * math.sqrt(epochs)
        t0 = time.perf_counter()
        est, eta = laplace_allocation_delta(b, t, epochs, eps, n_samples=samples, seed=4000 + 10 * t + epochs)
        mc_s = time.perf_counter() - t0
        iv = PLDAccountant("add_remove").compose(E.Sampled(E.LaplaceEvent(b), 1.0 / t, "random_allocation"),
                                                 t * epochs).delta(eps)
        for j, e in enumerate(eps):
            mc_rows.append({"b": b, "t": t, "epochs": epochs, "eps": float(e), "lower": float(iv.lower[j]),
                            "upper": float(iv.upper[j]), "estimate": float(est[j]), "eta": eta, "samples": samples,
                            "mc_seconds": mc_s,
                            "inside": bool(iv.lower[j] <= est[j] + eta and est[j] - eta <= iv.upper[j])})
            print(mc_rows[-1], flush=True)
    return {"rows": rows, "mc": mc_rows}


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
    for t, epochs, eps, k in [(*x, 1) for x in SAVING] + SAVING_K:
        q, steps = k / t, t * epochs
        kw = {"selections": k} if k > 1 else {}
        t0 = time.perf_counter()
        pois = pldlib.calibrate(eps, DELTA, q, steps, sampling="poisson")
        tp = time.perf_counter() - t0
        t0 = time.perf_counter()
        ra = pldlib.calibrate(eps, DELTA, q, steps, sampling="random_allocation", **kw)
        tr = time.perf_counter() - t0

        def make(sig, q=q, steps=steps, kw=kw):
            return pldlib.account(pldlib.Gaussian(sig, q=q, sampling="random_allocation", **kw), steps=steps)

        ra_floor = _sigma_where_lower_exceeds(make, eps, DELTA, ra.sigma)
        rows.append({"t": t, "k": k, "epochs": epochs, "steps": steps, "eps": eps, "sigma_poisson": pois.sigma,
                     "sigma_poisson_lower": pois.sigma_lower, "sigma_ra": ra.sigma, "sigma_ra_floor": ra_floor,
                     "seconds_poisson": tp, "seconds_ra": tr,
                     "saving_certified": 1.0 - ra.sigma / pois.sigma,
                     "saving_at_most": None if ra_floor is None else 1.0 - ra_floor / (pois.sigma_lower or pois.sigma)})
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", default="all", choices=["truncated", "allocation", "kmc", "noise", "saving", "all"])
    a = ap.parse_args(argv)
    CACHE.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")
    for part, fn in (("truncated", run_truncated), ("allocation", run_allocation), ("kmc", run_kmc),
                     ("noise", run_noise), ("saving", run_saving)):
        if a.part in (part, "all"):
            rows = fn()
            (CACHE / f"{part}.json").write_text(json.dumps(rows, indent=1, default=_f))


if __name__ == "__main__":
    main()
