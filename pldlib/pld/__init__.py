"""The grid engine shared by the PLD, PRV and random-allocation accountants: grids,
discretisation, FFT composition, and trade-off curves.

* :mod:`.grid` -- discrete PLDs on a uniform grid (:class:`DiscretePLD`, :class:`GridMeasure`)
* :mod:`.discretize` -- connect-the-dots (pessimistic), tangents + convex hull (optimistic),
  privacy buckets (baseline)
* :mod:`.compose` -- certified FFT composition (tilts, windows, alias and round-off terms)
* :mod:`.tradeoff` -- trade-off curves (power) from discrete PLDs

The accountant that uses them is :class:`pldlib.methods.pld.PLDAccountant`.
"""
from .grid import DiscretePLD, GridMeasure  # noqa: F401
