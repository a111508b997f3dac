"""A 30-digit truth for k of t random allocation: one epoch, t = 3 steps, k = 2 selections.

Under Q the coordinates' likelihood ratios are Y_j = exp(Z_j / s - 1 / (2 s^2)), Z_j iid N(0, 1),
and the epoch's likelihood ratio is S = e_2(Y) / 3 = (Y1 Y2 + Y3 (Y1 + Y2)) / 3, linear in Y3
given (Y1, Y2).  So, with the lognormal call / put prices in closed form,

    remove: E_Q (S - g)_+ = E[ (Y1 + Y2)/3 * call((3 g - Y1 Y2) / (Y1 + Y2)) ],
    add:    E_Q (1 - g S)_+ = E[ g (Y1 + Y2)/3 * put((3 / g - Y1 Y2) / (Y1 + Y2)) ],

a two-dimensional integral over (Z1, Z2), done by nested mpmath tanh-sinh quadrature at 30 digits
on [-16, 16]^2, the inner integral split where the strike crosses 0 (independent of pldlib).  Each value takes a few minutes on one core; the values are cached in
results/batches/k_of_t_truth.json, which tests/test_allocation_k_of_t.py reads (and checks against
a double-precision nested scipy quadrature of the same integral).

Run: ``python -m benchmarks.k_of_t_truth`` (about half an hour).
"""
from __future__ import annotations

import json
import pathlib
import time

OUT = pathlib.Path("results/batches/k_of_t_truth.json")
#: (sigma, eps) at which the truth is computed, both directions
POINTS = [(1.0, 0.5), (1.0, 1.5), (0.8, 0.5)]
DPS = 30
#: the integration range [-RANGE, RANGE] of each normal variable: beyond, the normal density is below
#: 1e-56 and the integrands grow at most like e^(2 |z| / s), so what is left out is below 1e-38 for
#: the sigmas >= 0.8 of POINTS
RANGE = 16


def truth_t3k2(sigma: float, eps: float, direction: str, dps: int = DPS):
    """delta of one epoch of 2 of 3 random allocation (Gaussian noise sigma, sensitivity 1) in the
    ``direction`` 'remove' or 'add', by nested mpmath tanh-sinh quadrature: (value, the outer
    integral's error estimate, the largest inner error estimate times its normal density) as mpfs.

    The inner integral (over Z2) is split where the strike crosses 0 (there the call / put price is
    smooth but not analytic; on each side it is); the add direction's integrand is 0 beyond."""
    import mpmath as mp

    from pldlib.testing.truth import lognormal_call_put

    mp.mp.dps = dps
    s = mp.mpf(sigma)
    call, put = lognormal_call_put(sigma)
    g = mp.e ** mp.mpf(eps)
    num = 3 * g if direction == "remove" else 3 / g

    def Y(z):
        return mp.e ** (z / s - 1 / (2 * s * s))

    worst = [mp.mpf(0)]  # the largest error estimate of an inner integral (times its density)

    def inner(z1):
        y1 = Y(z1)
        zs = s * (mp.log(num / y1) + 1 / (2 * s * s))  # the strike is 0 where Y2 = num / Y1

        def f(z2):
            y2 = Y(z2)
            a = y1 + y2
            if direction == "remove":
                return a / 3 * call((num - y1 * y2) / a) * mp.npdf(z2)
            return g * a / 3 * put((num - y1 * y2) / a) * mp.npdf(z2)

        lo, hi = mp.mpf(-RANGE), mp.mpf(RANGE)
        pts = [lo] + ([zs] if lo < zs < hi else []) + [hi]
        if direction == "add":
            pts = [p for p in pts if p <= zs]
            if len(pts) < 2:
                return mp.mpf(0)
        v, err = mp.quad(f, pts, error=True)
        worst[0] = max(worst[0], err * mp.npdf(z1))
        return v * mp.npdf(z1)

    v, err = mp.quad(inner, [-RANGE, -5, 0, 5, RANGE], error=True)
    return v, err, worst[0]


def main() -> None:
    import mpmath as mp

    OUT.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(OUT.read_text())["rows"] if OUT.exists() else []
    done = {(r["sigma"], r["eps"], r["direction"]) for r in rows}
    for sigma, eps in POINTS:
        for direction in ("remove", "add"):
            if (sigma, eps, direction) in done:
                continue
            t0 = time.perf_counter()
            v, err, inner_err = truth_t3k2(sigma, eps, direction)
            rows.append({"sigma": sigma, "eps": eps, "direction": direction, "t": 3, "k": 2,
                         "delta": mp.nstr(v, DPS), "error_estimate": mp.nstr(err, 3),
                         "inner_error_estimate": mp.nstr(inner_err, 3), "seconds": time.perf_counter() - t0})
            print(rows[-1], flush=True)
            OUT.write_text(json.dumps({"dps": DPS, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
