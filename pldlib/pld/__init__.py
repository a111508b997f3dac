"""The PLD method: grids, discretisation, FFT composition and the accountant.

* :mod:`.grid` -- discrete PLDs on a uniform grid (:class:`DiscretePLD`, :class:`GridMeasure`)
* :mod:`.discretize` -- connect-the-dots (pessimistic), tangents + convex hull (optimistic),
  privacy buckets (baseline)
* :mod:`.compose` -- certified FFT composition (tilts, windows, alias and round-off terms)
* :mod:`.accountant` -- :class:`PLDAccountant`: events in, intervals out
"""
from .grid import DiscretePLD, GridMeasure  # noqa: F401
