"""Independent truths for tests and benchmarks (not used by the numeric library).

* :mod:`.truth` -- high-precision (mpmath) privacy profiles and composition truths
* :mod:`.montecarlo` -- Monte Carlo estimates of delta(eps) with confidence bounds
"""
