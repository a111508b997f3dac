"""Random allocation beside an independent implementation: Feldman and Shenfeld's PLD_accounting
package bounds eps(delta) of the same scheme from above and below; both of its bounds and both
of pldlib's are claims about one number, so the two intervals must meet."""
import warnings

import pytest

import pldlib

PLD_accounting = pytest.importorskip("PLD_accounting")


@pytest.mark.parametrize("sigma,t,epochs", [(1.0, 10, 1), (2.0, 10, 3)])
def test_intervals_meet(sigma, t, epochs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        up, lo = PLD_accounting.gaussian_allocation_epsilon_range(delta=1e-5, sigma=sigma, num_steps=t, num_selected=1,
                                                                  num_epochs=epochs)
    iv = pldlib.account(pldlib.Gaussian(sigma, q=1.0 / t, sampling="random_allocation"), steps=t * epochs).epsilon(1e-5)
    assert iv.lower <= up * (1 + 1e-9) and lo <= iv.upper * (1 + 1e-9), (iv, (lo, up))
