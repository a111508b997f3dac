"""Narrow certified delta for randomized-response compositions at an epsilon on (or next to)
an atom of the composed loss, pinned against exact binomial sums in mpmath."""
import warnings

import mpmath as mp
import numpy as np
import pytest

from pldlib.exact import BinomialExact


def _rr_delta(eps0: float, K: int, eps: float) -> mp.mpf:
    """sum_j C(K, j) p^j q^(K-j) (1 - e^{eps - (2j - K) eps0})_+ at 60 digits, eps0 and eps
    taken as the exact doubles."""
    with mp.workdps(60):
        e0, x = mp.mpf(eps0), mp.mpf(eps)
        p = 1 / (1 + mp.exp(-e0))
        q = 1 - p
        tot = mp.mpf(0)
        for j in range(K + 1):
            loss = (2 * j - K) * e0
            if loss > x:
                tot += mp.binomial(K, j) * p ** j * q ** (K - j) * (1 - mp.exp(x - loss))
        return tot


CASES = [(0.1, 10, 1.0), (0.1, 10, 0.8), (0.3, 7, 2.1), (0.7, 3, 2.1), (0.1, 30, 3.0),
         (1e-3, 1000, 1.0), (0.2, 5, 0.6), (0.1, 10, 0.9), (0.1, 10, 1.1), (2.5, 4, 10.0)]


@pytest.mark.parametrize("eps0,K,eps", CASES)
def test_boundary_atom_bounds_are_sound_and_narrow(eps0, K, eps):
    lo, hi = BinomialExact(eps0, K).delta_bounds(np.array([eps]))
    lo, hi = float(lo[0]), float(hi[0])
    truth = _rr_delta(eps0, K, eps)
    assert mp.mpf(lo) <= truth <= mp.mpf(hi)
    if truth == 0:
        assert hi == 0.0
    else:
        assert hi - lo <= 1e-12 * float(truth) + 3e-320


def test_accountant_rr_delta_on_the_top_atom():
    from pldlib.methods.pld import PLDAccountant
    import pldlib.mechanisms as M
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = PLDAccountant("add_remove")
        a.compose(M.RandomizedResponse(eps0=0.1), 10)
        iv = a.delta(1.0)
    truth = _rr_delta(0.1, 10, 1.0)
    assert mp.mpf(iv.lower) <= truth <= mp.mpf(iv.upper)
    assert iv.upper - iv.lower <= 1e-12 * float(truth)
