"""The PLD accountant's grid policy: which spacing, which tail, which discretisations.

* the spacing rule (:func:`_rule_interval`, docs/MATH.md 5.1) and its refinement from a probe
  answer's width (:meth:`GridPolicy._build_auto`);
* the truncated tail mass per step (:func:`_tail_for`: sent to +inf, the pessimistic side);
* each branch's single-step PLDs at spacing h, built on first use (:class:`_Discretised`), with
  the cheap coarse PLDs that screen branches and estimate tilts;
* laying out a typical query's composition before any FFT so that an automatic grid is coarsened
  once, by the right factor, to fit the budgets (:meth:`GridPolicy._fits`,
  :mod:`pldlib.methods.pld_budget`).

None of this decides a bound: every grid gives certified answers; the policy only chooses how
tight and how fast.
"""
from __future__ import annotations

import math
import time

import numpy as np

from .. import _validate as V
from .. import exact as X
from .._validate import GridTooLargeError
from .base import branch_labels
from .schedule import GROUP_RATIO, GroupedStep
from .pld_budget import (AUTO_STEP_POINTS, BYTES_PER_BIN, GRID_BYTES_PER_POINT, MAX_COARSEN, _coarsen_factor)
from ..pld.compose import CUT_REL, _fft_threads, compose, estimate_tilt
from ..pld.discretize import (Grid, connect_the_dots, grid_for, hull_offset, kept_points, optimistic,
                              privacy_buckets)
from ..profiles.base import loss_range

__all__ = ["GridPolicy", "DISCRETISATIONS"]


#: spacing of the cheap pessimistic PLDs that test whether a branch can matter, in units of h ...
COARSE_FACTOR = 8
#: ... doubled while their smallest grid keeps at least this many points: on fine grids the cheap
#: PLDs (screens of other branches, tilt estimates, the choice of points to connect) then cost
#: what they cost at coarser h instead of growing with 1/h (DP-SGD headline: 8 h at h = 1e-4,
#: 64 h at h = 1.24e-5)
COARSE_POINTS = 4096
#: an upper-only accountant's eps(delta) query connects the dots of a branch of at most THIN_MAX_COMPONENTS
#: components at the points that matter at its tilt only (:func:`kept_points`, docs/MATH.md 3.1)
#: when its grids have at least THIN_FROM points (the cheap PLDs of :meth:`_Discretised.coarse` choose them)
THIN_FROM = 4096
THIN_MAX_COMPONENTS = 4
#: a component that would keep more than this fraction of its points keeps all of them (instruction
#: counts: keeping 78% of the points cost as much as keeping all, 84% 2% more)
THIN_MAX_KEPT = 0.9
#: thinned PLD lists kept per discretisation (each for one set of points; the oldest is dropped)
THIN_CACHE = 8
#: a screened branch whose normal-approximation score (``_likely_first``) lies at least this relative
#: distance below the first branch's is screened first at SCREEN_SPREAD times the cheap spacing (4x
#: fewer points, a 4x smaller composition), and at the cheap spacing only where that one cannot skip
#: it (on 24 benchmark cases every branch with such a gap was skipped at the wider spacing already)
SCREEN_SPREAD_GAP = 0.02
SCREEN_SPREAD = 4
#: ... provided its grids at that spacing keep at least this many points (DP-SGD headline: 1,001 at
#: h = 9.9e-5; on coarser ones the wider screen would rarely skip)
SCREEN_SPREAD_POINTS = 512
#: from this many distinct components on, every branch is composed in full (no coarse screening:
#: its discretisations would cost more than the branch it might skip)
SCREEN_MAX_COMPONENTS = 32
#: branches whose normal-approximation scores (``_likely_first``) are within this relative
#: distance of the highest are all composed in full, unscreened
SCREEN_CLOSE = 1e-3
#: the spacing rule's h^2 term: h <= sqrt(RULE_C * eps_typ / K) (docs/MATH.md 5.1)
RULE_C = 0.002
#: the automatic grid is refined when a probe's relative width exceeds this (aiming at 0.4%)
REFINE_ABOVE = 0.006
#: names accepted by ``account(..., discretisation=...)``
DISCRETISATIONS = ("connect_the_dots", "privacy_buckets")

#: total P-mass of all steps' single-step losses truncated to +inf (pessimistic) is at most this
TAIL_TOTAL = 1e-32
#: the per-step truncated mass is TAIL_TOTAL / max(steps, TAIL_STEPS): the same for every steps
#: count up to 10^6, so one discretisation serves them all (:func:`account_steps`)
TAIL_STEPS = 10**6


def _cut_scale(deltas) -> float | None:
    """The power of ten at or below the smallest delta asked (a composition's ``cut_scale``:
    tails below CUT_REL of it are not worth a window; bucketed so that nearby queries share
    one composition)."""
    d = float(np.min(deltas)) if np.size(deltas) else 0.0
    if not d > 0.0:
        return None
    return 10.0 ** math.floor(math.log10(d))


def _tail_for(total_steps: int) -> float:
    return TAIL_TOTAL / max(int(total_steps), TAIL_STEPS)


def _discretisation(name) -> str:
    if not isinstance(name, str) or name not in DISCRETISATIONS:
        raise ValueError(f"discretisation: must be one of {', '.join(DISCRETISATIONS)}, got {name!r}")
    return name


class _Discretised:
    """The single-step PLDs of one branch (one direction) at spacing h, built on first use.

    The grids are laid out (and their size checked) at construction; the
    connect-the-dots and convex-hull PLDs are computed only when a query needs
    this branch at full accuracy.  ``coarse()`` gives pessimistic PLDs of the
    same profiles at the cheap spacing :meth:`coarse_factor` * h (for the dominance test of
    :meth:`PLDAccountant.epsilon`).  Shared by the accountants that
    :func:`account_steps` derives from one discretisation.
    """

    def __init__(self, pairs, h, tail, max_bins, discretisation, upper_only=False):
        self.pairs = pairs  # [(upper profile, lower profile)] per component
        self.h, self.tail, self.max_bins = h, tail, max_bins
        self.discretisation = discretisation
        self.upper_only = upper_only
        # the optimistic hull uses an offset lattice where a support edge lies within 2h of 0
        # (docs/MATH.md 3.2); buckets round losses down and need none
        hull = discretisation != "privacy_buckets"
        self.grids = [(grid_for(pu, h, tail, max_bins),
                       None if upper_only else grid_for(pl, h, tail, max_bins,
                                                        offset=hull_offset(pl, h) if hull else 0.0))
                      for pu, pl in pairs]
        self._whole = [None, None]    # [uppers, lowers] on the whole grids
        self._levels: dict = {}       # truncation tail -> [uppers, lowers] on truncated grids
        self._level_grids: dict = {}  # truncation tail -> [(upper grid, lower grid or None)]
        self._coarse: dict = {}       # truncation tail (None: whole) -> coarse pessimistic PLDs
        self._carried: dict = {}      # truncation tail -> fine pessimistic PLDs carried to the coarse spacing
        self._moments0 = None         # per component (mean, variance, p_inf) by quadrature; [] if none
        self._thinned: dict = {}      # (tail, points kept per component) -> (serial, thinned pessimistic PLDs)
        self._serial = 0

    def _slots(self):
        return [self._whole, *self._levels.values()]

    @property
    def _fine(self):
        """(uppers, lowers or None) on the whole grids, None until built."""
        u, lo = self._whole
        return None if u is None or (lo is None and not self.upper_only) else (u, lo)

    @property
    def built(self) -> bool:
        """Whether the fine PLDs of every side computed are built (at some range)."""
        return any(u is not None and (self.upper_only or lo is not None) for u, lo in self._slots())

    @property
    def uppers_built(self) -> bool:
        return any(u is not None for u, _ in self._slots())

    def level_for(self, cut_scale, counts) -> float | None:
        """The truncation tail of a query composed with ``cut_scale`` (None: the whole range):
        a power of ten at or below TRUNCATE_MARGIN * CUT_REL * cut_scale / steps."""
        if cut_scale is None or not cut_scale > 0.0:
            return None
        t = TRUNCATE_MARGIN * CUT_REL * float(cut_scale) / max(sum(int(k) for k in counts), 1)
        if not t > 10.0 * self.tail or max(g.n for g, _ in self.grids) < TRUNCATE_FROM:
            return None
        return 10.0 ** math.floor(math.log10(t))

    def _truncated(self, grid, profile, t: float):
        """The points of ``grid`` between where ``profile``'s tail masses fall to ``t`` (the same
        lattice points).  Connect-the-dots puts the mass left of its first point there and the
        curve left at its last point at +inf, and the optimistic hull stays under the curve on
        any grid, so a truncated grid is as sound as a whole one (docs/MATH.md 4.3)."""
        if grid is None:
            return None
        try:
            lo, hi = loss_range(profile, t)
        except (ValueError, ArithmeticError):
            return grid
        start = max(min(int(math.floor((lo - grid.offset) / grid.h)), -1), grid.start)
        stop = min(max(int(math.ceil((hi - grid.offset) / grid.h)), 1), grid.start + grid.n)
        if start == grid.start and stop == grid.start + grid.n:
            return grid
        return Grid(h=grid.h, start=start, n=stop - start, offset=grid.offset)

    def _grids_at(self, t):
        if t is None:
            return self.grids
        g = self._level_grids.get(t)
        if g is None:
            g = self._level_grids[t] = [(self._truncated(gu, pu, t), self._truncated(gl, pl, t))
                                        for (pu, pl), (gu, gl) in zip(self.pairs, self.grids)]
        return g

    def _one(self, pair, grids, t=None):
        """(upper PLD, lower PLD or None) of one component."""
        return self._one_upper(pair, grids), self._one_lower(pair, grids, t)

    def _one_upper(self, pair, grids):
        (pu, _pl), (gu, _gl) = pair, grids
        if self.discretisation == "privacy_buckets":
            return privacy_buckets(pu, gu, pessimistic=True)
        return connect_the_dots(pu, gu)

    def _one_lower(self, pair, grids, t=None):
        (_pu, pl), (_gu, gl) = pair, grids
        if gl is None:
            return None
        if self.discretisation == "privacy_buckets":
            return privacy_buckets(pl, gl, pessimistic=False)
        try:
            return optimistic(pl, gl)
        except ValueError:
            if gl.offset == 0.0:
                raise
            # no admissible tangent in the offset cell: the lattice through 0
            g0 = grid_for(pl, self.h, self.tail, self.max_bins)
            return optimistic(pl, g0 if t is None else self._truncated(g0, pl, t))

    def fine_uppers(self, t: float | None = None) -> list:
        """The pessimistic PLDs alone (a branch whose lower bound is not needed skips the
        optimistic ones: :meth:`PLDAccountant._combine`); ``t``: on grids truncated at that tail
        (:meth:`level_for`; a query's answer never depends on what earlier queries built)."""
        slot = self._whole if t is None else self._levels.setdefault(t, [None, None])
        if slot[0] is None:
            grids = self._grids_at(t)
            slot[0] = _map(self._one_upper, self.pairs, grids, points=_points(grids))
        return slot[0]

    def fine(self, t: float | None = None):
        """(pessimistic PLDs, optimistic PLDs or None), on grids truncated at ``t`` if given."""
        if self.upper_only:
            return self.fine_uppers(t), None
        slot = self._whole if t is None else self._levels.setdefault(t, [None, None])
        if slot[1] is None:
            grids = self._grids_at(t)
            if slot[0] is None:
                done = _map(lambda pair, g: self._one(pair, g, t), self.pairs, grids, points=_points(grids))
                slot[0], slot[1] = [u for u, _ in done], [lo for _, lo in done]
            else:
                slot[1] = _map(lambda pair, g: self._one_lower(pair, g, t), self.pairs, grids, points=_points(grids))
        return slot[0], slot[1]

    def coarse_factor(self, t: float | None = None) -> int:
        """k of the cheap PLDs' spacing k h on grids truncated at ``t``: COARSE_FACTOR, doubled
        while the smallest of those grids has at least 2 k COARSE_POINTS points."""
        n = min(gu.n for gu, _ in self._grids_at(t))
        k = COARSE_FACTOR
        while n // (2 * k) >= COARSE_POINTS:
            k *= 2
        return k

    def fits_wide_screen(self, t: float | None = None) -> bool:
        """Whether this branch's grids truncated at ``t`` keep at least SCREEN_SPREAD_POINTS
        points at SCREEN_SPREAD times the cheap spacing."""
        n = min(gu.n for gu, _ in self._grids_at(t))
        return n // (self.coarse_factor(t) * SCREEN_SPREAD) >= SCREEN_SPREAD_POINTS

    def coarse(self, t: float | None = None, spread: int = 1):
        """Pessimistic PLDs at spacing :meth:`coarse_factor` * ``spread`` * h (a cheap certified
        upper bound; any spacing is one); ``t``: on grids truncated at that tail
        (:meth:`level_for`, as the fine ones)."""
        key = t if spread == 1 else (t, spread)
        hit = self._coarse.get(key)
        if hit is None:
            k = self.coarse_factor(t) * spread
            hc = k * self.h
            tail = self.tail if t is None else max(self.tail, t)
            hit = self._coarse[key] = _map(
                lambda pair: connect_the_dots(pair[0], grid_for(pair[0], hc, tail, self.max_bins)),
                self.pairs, points=_points(self.grids) / k)
        return hit

    def fine_coarsened(self, t: float | None = None) -> list:
        """The fine pessimistic PLDs (on grids truncated at ``t``) carried to spacing
        :meth:`coarse_factor` * h (:meth:`DiscretePLD.coarsened`): inputs of estimates only."""
        if t not in self._carried:
            k = self.coarse_factor(t)
            self._carried[t] = [p.coarsened(k) for p in self.fine_uppers(t)]
        return self._carried[t]

    def thinnable(self, t: float | None) -> bool:
        """Whether :meth:`thinned_uppers` may pay on grids truncated at ``t``."""
        return (self.discretisation == "connect_the_dots" and len(self.pairs) <= THIN_MAX_COMPONENTS
                and min(gu.n for gu, _ in self._grids_at(t)) >= THIN_FROM)

    def thinned_uppers(self, t: float | None, theta: float) -> tuple[int, list] | None:
        """(serial, pessimistic PLDs) connecting the dots only at the points that matter for a
        composition tilted by ``theta`` (:func:`kept_points`, chosen from :meth:`coarse`), on
        grids truncated at ``t``; None when it does not pay (few points, many components, no
        connect-the-dots): then :meth:`fine_uppers` serve.  The points
        depend on ``t`` and ``theta`` alone, so a query's answer never depends on what earlier
        queries built; the serial names the list for caches of its compositions."""
        if not self.thinnable(t):
            return None
        grids = self._grids_at(t)
        keeps = [kept_points(gu, c, theta) for (gu, _), c in zip(grids, self.coarse(t))]
        keeps = [None if k is None or k.size > THIN_MAX_KEPT * (g.n + 1) else k for k, (g, _) in zip(keeps, grids)]
        if all(k is None for k in keeps):
            return None
        key = (t, tuple(None if k is None else k.tobytes() for k in keeps))
        hit = self._thinned.pop(key, None)
        if hit is None:
            self._serial += 1
            hit = (self._serial, [connect_the_dots(pu, gu, keep=k) for (pu, _), (gu, _), k
                                  in zip(self.pairs, grids, keeps)])
        self._thinned[key] = hit  # (most recently used last)
        while len(self._thinned) > THIN_CACHE:
            self._thinned.pop(next(iter(self._thinned)))
        return hit

    def step_moments(self) -> list | None:
        """Per component: (mean, variance, P(L = inf)) of one step's loss under its pessimistic
        profile, from the profile's quadrature (:meth:`PrivacyProfile.loss_moments`, an
        estimate); None when a profile has none (then callers use coarse PLDs)."""
        if self._moments0 is None:
            out = []
            for pu, _pl in self.pairs:
                try:
                    m = pu.loss_moments()
                except (ArithmeticError, ValueError):
                    m = None
                if m is None:
                    out = []
                    break
                out.append((m[0], m[1], float(pu.p_inf)))
            self._moments0 = out
        return self._moments0 or None


def _points(grids) -> float:
    """Average points of the (upper) grids of a list of components."""
    return sum(gu.n for gu, _ in grids) / max(len(grids), 1)



#: a query's fine PLDs end where a step's right tail falls below TRUNCATE_MARGIN times the per-step
#: threshold beyond which its composition cuts tails anyway (compose.CUT_REL * cut_scale / steps,
#: docs/MATH.md 4.3): the rest of the range (down to the accountant's own tail) is built only for
#: queries that need it.  Grids below TRUNCATE_FROM points are always built whole.
TRUNCATE_MARGIN = 0.25
TRUNCATE_FROM = 4096

#: from this many components on, their discretisations run on a thread pool ...
THREADS_FROM = 32
#: ... when their grids average at least this many points (measured on 2 cores: schedules of
#: ~350 components of 3,000-7,000 points ran 15-25% slower on two threads than on one)
THREADS_POINTS = 2**15


def _map(fn, *items, points: float = math.inf) -> list:
    """[fn(*args) for args in zip(*items)], on ``PLDLIB_FFT_WORKERS`` threads (default: the CPUs
    this process may use, at most 8) when there are at least THREADS_FROM items of ``points``
    >= THREADS_POINTS grid points on average (the profile evaluations are numpy loops that
    release the GIL, which pays on long arrays only).  Order kept; the first exception is raised."""
    n = len(items[0])
    workers = _fft_threads()
    if n < THREADS_FROM or workers < 2 or points < THREADS_POINTS:
        return [fn(*args) for args in zip(*items)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(workers, n)) as ex:
        return list(ex.map(fn, *items))


def _tilt_plds(st, cut=None) -> list:
    """PLDs to estimate a tilt on (it needs no precision), for a branch about to be composed
    at full accuracy (its fine pessimistic PLDs are built next anyway): those fine PLDs carried
    to the cheap spacing (:meth:`DiscretePLD.coarsened`: ~20 us on 3,000 points, where a
    coarse connect-the-dots of the profile costs ~0.5 ms); the fine PLDs themselves for long
    schedules (many components: the estimate's passes over them cost less than the carries)."""
    if len(st.counts) >= SCREEN_MAX_COMPONENTS:
        return st.uppers_at(cut)
    return st.source.fine_coarsened(st.source.level_for(cut, st.counts))


def _estimated_tilt(st, plds, delta: float, cut) -> float:
    """:func:`estimate_tilt` of ``plds`` (a branch's cached list) composed ``st.counts`` times,
    kept per (list, delta, cut) on the branch."""
    key = (id(plds), float(delta), cut)
    hit = st.tilts.get(key)
    if hit is None:
        hit = st.tilts[key] = estimate_tilt(plds, st.counts, float(delta), cut)
    return hit


class _BranchState:
    """One branch label of an accountant: its (lazily built) PLDs, counts and compositions."""

    def __init__(self, label: str, source: _Discretised, counts: list):
        self.label = label
        self.source = source
        self.counts = counts
        self.cache: dict = {}
        self.coarse_cache: dict = {}
        self.tilts: dict = {}  # (id of a PLD list, delta, cut) -> estimated tilt

    @property
    def uppers(self) -> list:
        return self.source.fine_uppers()

    def uppers_at(self, cut_scale) -> list:
        """The pessimistic PLDs a composition with this ``cut_scale`` needs (truncated beyond
        what it cuts: :meth:`_Discretised.level_for`)."""
        return self.source.fine_uppers(self.source.level_for(cut_scale, self.counts))

    def lowers_at(self, cut_scale) -> list:
        return self.source.fine(self.source.level_for(cut_scale, self.counts))[1]

    def coarse_at(self, cut_scale, spread: int = 1) -> list:
        return self.source.coarse(self.source.level_for(cut_scale, self.counts), spread)

    @property
    def lowers(self) -> list:
        return self.source.fine()[1]


def _check_interval(h: float, per_comp, tail: float) -> None:
    """Refuse an explicit spacing h wider than half of every step's whole privacy-loss range
    (down to the truncated tail mass): each grid would hold at most two cells, and the
    certified interval, still valid, would say nothing (e.g. [-1e-5, 999.8] for 10 Gaussian
    steps at h = 100)."""
    widths = []
    for bl in per_comp:
        for b in bl:
            try:
                lo, hi = loss_range(b.upper, tail)
            except (ValueError, ArithmeticError):
                return  # the discretiser reports these itself
            widths.append(hi - lo)
    if widths and all(h > w / 2.0 for w in widths):
        w = max(widths)
        raise ValueError(f"spacing: {V.fmt(h)} is wider than half the whole single-step privacy-loss range "
                         f"({w:.3g}): the grid would hold at most two cells and the certified interval would "
                         f"be meaningless; use spacing <= {w / 50:.2g} or leave it automatic")


# -- accuracy knob ------------------------------------------------------------------------
#: from this many components on (schedules), the spacing rule's moments and widths come from
#: STATS_SAMPLE of them, evenly spaced; every component still gives its support edges
STATS_LIGHT_FROM = 64
STATS_SAMPLE = 24


def _step_stats(components, per_comp):
    """Per branch label, per component: (mean, variance, support width, support edges) of
    one step's loss (from a cheap connect-the-dots PLD at 4000 points).

    Long schedules (>= STATS_LIGHT_FROM components, e.g. grouped ones) compute the moments and
    widths of STATS_SAMPLE evenly spaced components only and give the others the sample's
    count-weighted means (the rule's sums are then estimates, which is all the rule needs: it
    only chooses the spacing, never a bound); support edges are each component's own."""
    out = []
    n_labels = max(len(b) for b in per_comp)
    n = len(components)
    sample = set(np.linspace(0, n - 1, STATS_SAMPLE).round().astype(int).tolist()) if n >= STATS_LIGHT_FROM \
        else set(range(n))
    for j in range(n_labels):
        row = [None] * n
        for i, ((m, _k), bl) in enumerate(zip(components, per_comp)):
            if i not in sample:
                continue
            prof = bl[min(j, len(bl) - 1)].upper
            lo, hi = prof.eps_bounds(1e-12)
            # (the grid spans 0 as well: a loss range away from 0 -- one atom, e.g. a lattice
            # pair's single finite loss -- must not make the spacing 1e-9)
            h0 = max((max(hi, 0.0) - min(lo, 0.0)) / 4000.0, 1e-9)
            pld = connect_the_dots(prof, grid_for(prof, h0, 1e-12))
            mu, v = pld.moments()
            # an optimistic PLD cannot resolve mass between 0 and a support edge
            # closer than h (e.g. ln(1-q) for Poisson remove): keep h below half of it
            edges = [abs(e) for e in (lo, hi) if e != 0.0 and math.isfinite(e)]
            row[i] = (mu, v, hi - lo, edges)
        if len(sample) < n:
            ks = np.array([components[i][1] for i in sorted(sample)], dtype=float)
            st = [row[i] for i in sorted(sample)]
            mu_bar = float(np.dot(ks, [t[0] for t in st]) / ks.sum())
            v_bar = float(np.dot(ks, [t[1] for t in st]) / ks.sum())
            w_min = min(t[2] for t in st)
            for i, bl in enumerate(per_comp):
                if row[i] is None:
                    lo, hi = bl[min(j, len(bl) - 1)].upper.support_edges()
                    row[i] = (mu_bar, v_bar, w_min, [abs(e) for e in (lo, hi) if e != 0.0 and math.isfinite(e)])
        out.append(row)
    return out


def _edge_factor(discretisation: str) -> float:
    """The edge term of the spacing rule (docs/MATH.md 5.1): h <= edge / 2 for privacy buckets
    (their optimistic side needs lattice points inside the edge), h <= EDGE_FACTOR_CTD * edge
    otherwise: the hull's offset lattice puts a point inside the edge at any h, and the probe
    refines h where the width needs it, so the edge only caps h loosely (at 1x it bound at small
    sigma and small q and bought widths ~100x below the 0.6% aim at 2-7x the time)."""
    return 0.5 if discretisation == "privacy_buckets" else EDGE_FACTOR_CTD


#: the spacing rule's edge term for connect-the-dots: h <= this * (nearest single-step support edge)
EDGE_FACTOR_CTD = 8.0


def _rule_interval(stats, counts, edge_factor: float | None = 1.0, c: float | None = None) -> tuple[float, float]:
    """h = min(s_K / 50, sqrt(c * eps_typ / K), edge_factor * edge) (and (eps_typ) of the binding branch).

    Connect-the-dots shifts each step's loss by about h^2/8 (optimistic
    side: a few times that), so the width after K steps grows like K h^2; the
    h^2 term (c = RULE_C by default) puts a probe answer's relative width at a
    typical epsilon eps_typ = mean + 3 sd of the composed loss under about 0.6%, and
    resolving the composed spread s_K by 50 points gives the first term (docs/MATH.md 5.1).
    ``edge`` is the distance from 0 to the nearest edge of a single-step loss support
    (|ln(1-q)| for Poisson remove): it keeps one step's loss law resolved.
    The accountant then refines h (at most twice) from a probe answer's width.
    ``stats`` comes from :func:`_step_stats`; ``counts`` are the steps per component.
    ``edge_factor=None`` drops the edge term: the spacing an *upper* bound needs (calibration,
    which also passes its own ``c``).
    """
    c = RULE_C if c is None else float(c)
    ef = 0.5 if edge_factor is None else float(edge_factor)  # (no edges then: only the 0.2 default)
    best, best_eps = math.inf, 1.0
    for row in stats:
        mean = var = 0.0
        K = 0
        widths = []
        edge_list = []
        for (mu, v, width, e), k in zip(row, counts):
            mean += k * mu
            var += k * v
            K += k
            if width > 0:
                widths.append(width)
            if edge_factor is not None:
                edge_list.extend(e)
        s = math.sqrt(max(var, 1e-300))
        eps_typ = max(mean + 3 * s, 1e-3)
        if var <= 0 or not widths:  # a single atom per step: any spacing resolves it
            h = min(ef * min(edge_list, default=0.2), 0.1)
        else:
            h = min(s / 50.0, math.sqrt(c * eps_typ / K), min(widths) / 50.0,
                    ef * min(edge_list, default=math.inf))
        if h < best:
            best, best_eps = h, eps_typ
    return float(max(best, 1e-6)), best_eps


class GridPolicy:
    def _build_timed(self):
        t0 = time.perf_counter()
        self.accuracy_limited = False
        self._split()
        if self._exact is not None or not self._eff:
            if self._exact is None:
                self._exact = X.PinfWrapped(self._pinf, X.IdentityExact().delta_bounds,
                                            X.IdentityExact().epsilon_bounds)
            # no grid is used; ``spacing`` reports an explicit option back as given, else the
            # spacing the automatic rule would have chosen (callers such as calibrate reuse it)
            self._labels, self.tail, self._branches = [], 0.0, []
            if self._spacing_opt is not None:
                self.spacing = float(self._spacing_opt)
            else:
                try:
                    self.spacing = float(self._rule_start()) if self._eff else 0.1
                except Exception:
                    self.spacing = 0.1
            self.setup_seconds = time.perf_counter() - t0
            return
        if self._spacing_opt is None and not self._bins_explicit:
            budget_bins = max(16, min(self.max_bins, self.memory_budget // BYTES_PER_BIN))
            saved = self.max_bins
            self.max_bins = budget_bins
            try:
                self._build_grid(t0, None)
                last = None
                for _ in range(MAX_COARSEN):
                    if all(st.cache for st in self._branches):
                        break  # the refinement probe composed every branch at this spacing: it fits
                    try:
                        self._fits()  # the window of a typical query must fit the memory budget
                        break
                    except MemoryError as e:
                        if self._futile(e, last):
                            break  # (the queries answer the trivial interval, see _auto)
                        last, factor = e, _coarsen_factor(e)
                    except (ArithmeticError, ValueError):
                        break
                    self._coarsen(factor)
            finally:
                self._auto_bins = self.max_bins
                self.max_bins = saved
        elif self._spacing_opt is None:
            self._build_auto(t0, self._rule_start())
        else:
            self._build_grid(t0, self._spacing_opt)

    def _fits(self) -> None:
        """Lay out (no FFT) each branch's composition at the tilt estimated for delta = 1e-5:
        raises what a query's composition would raise for its size (``GridTooLargeError``
        when it exceeds the memory budget or the points the time left pays for), so that the
        grid is coarsened once, by the right factor, before any composition."""
        deltas = np.array([1e-5])
        cut = _cut_scale(deltas)
        for st in self._branches:
            if st.cache:
                continue  # composed at this spacing already (the refinement probe): it fits
            if not st.source.uppers_built and len(self._eff) < SCREEN_MAX_COMPONENTS:
                self._fits_coarse(st, deltas, cut)
                continue
            theta = _estimated_tilt(st, _tilt_plds(st, cut), 1e-5, cut)
            # (the optimistic PLDs only where built: the window is laid out from the pessimistic
            # side, the wider one; a query that does not fit coarsens the grid itself, ``_auto``)
            compose(st.uppers_at(cut), st.lowers_at(cut) if not self.upper_only and st.source.built else None,
                    st.counts, theta=theta, max_bins=self._bins(), cut_scale=cut, dry_run=True)

    def _fits_coarse(self, st, deltas, cut) -> None:
        """:meth:`_fits` for a branch whose fine PLDs are not built (the refinement probe's
        coarse screen skipped it): its window is laid out from the coarse composition that the
        screen of a query at these deltas uses (:meth:`_coarse_upper`, cached for it), whose
        points at the cheap spacing k h are ~1/k of the fine window's.  Building
        the fine PLDs here would also turn off the branch's screen (only efficiency and the
        coarsening decision depend on this, never soundness: a query that does not fit
        coarsens the grid itself, :meth:`_auto`)."""
        limit = self._bins()
        k = st.source.coarse_factor(st.source.level_for(cut, st.counts))
        try:
            self._coarse_upper(st, deltas, "eps", strict=True)
            # (no coarse composition -- it could not be had: left to the query, which coarsens)
            # (each cached composition at its own cheap spacing: k can differ between levels)
            # (the wider screens' compositions, SCREEN_SPREAD, left out: this one decides)
            need = max((int(round(c.upper.h / st.source.h)) * c.n_bins for key, c in st.coarse_cache.items()
                        if len(key) == 2), default=0)
        except GridTooLargeError as e:
            need = k * (e.need or limit)
        if need > limit:
            raise GridTooLargeError(f"composition needs about {need:,} grid points (limit {limit:,})",
                                    need=need, limit=limit)

    def _rule_start(self):
        if self._start is not None:
            return float(self._start)
        per_comp = [m.branches() for m, _ in self._eff]
        return _rule_interval(_step_stats(self._eff, per_comp), [k for _, k in self._eff],
                              edge_factor=_edge_factor(self.discretisation))[0]

    def _build_grid(self, t0, interval):
        components = self._eff
        per_comp = [m.branches() for m, _ in components]
        if interval is None:
            h0, _ = _rule_interval(_step_stats(components, per_comp), [k for _, k in components],
                                   edge_factor=_edge_factor(self.discretisation))
            if self._start is not None:
                h0 = float(self._start)
            for _ in range(MAX_COARSEN):
                try:
                    self._build_auto(t0, h0)
                    return
                except MemoryError as e:  # GridTooLargeError, or numpy under a memory cap
                    self._limited(stacklevel=6)
                    h0 *= _coarsen_factor(e)
            raise GridTooLargeError("no grid fits the memory budget")
        self._build_fixed(t0, interval)

    def _build_fixed(self, t0, interval):
        components = self._eff
        per_comp = [m.branches() for m, _ in components]
        labels = branch_labels(per_comp)
        self._labels = labels
        self.tail = _tail_for(sum(k for _, k in components))
        interval = V.positive_finite("spacing", interval)
        _check_interval(interval, per_comp, self.tail)
        self._branches = self._discretise(labels, per_comp, interval)
        self.spacing = float(interval)
        self.setup_seconds = time.perf_counter() - t0

    def _build_auto(self, t0, h_start):
        components = self._eff
        interval = None
        per_comp = [m.branches() for m, _ in components]
        labels = branch_labels(per_comp)
        self._labels = labels
        self.tail = _tail_for(sum(k for _, k in components))
        if interval is None:
            h = float(h_start)
            self._branches = self._discretise(labels, per_comp, h)
            # refine once from a probe answer: the width of eps intervals scales
            # like h^2 (like h for privacy buckets), so aim the probe's relative
            # width at 0.4% (the probe's compositions stay cached when h is kept)
            rate = 0.5 if self.discretisation == "connect_the_dots" else 1.0
            # refine only above 0.6% (a second pass costs more than the first); grouped schedules
            # (docs/MATH.md 5.8): the cells add about 2 * GROUP_RATIO, which no finer grid removes
            trigger = REFINE_ABOVE + (2.0 * GROUP_RATIO if any(isinstance(m, GroupedStep) for m, _ in components)
                                      else 0.0)
            for _ in range(2):
                if self.accuracy_limited:
                    break  # already coarsened to fit: a finer grid cannot fit either
                relw = self._probe_width()
                if not relw > trigger:  # NaN: the probe did not fit
                    break
                # (privacy buckets: at most 4x finer per refinement, so the default stays cheap)
                h_new = h * max(0.95 * (0.004 / relw) ** rate, 0.25)  # (aims at 0.4% from the grid)
                previous = self._branches
                try:
                    self._branches = self._discretise(labels, per_comp, h_new)
                    if rate == 1.0 and math.isnan(self._probe_width()):
                        raise GridTooLargeError("probe composition too large")
                except GridTooLargeError:
                    self._branches = previous  # keep the finest grid that fits
                    if rate == 0.5 and self._bins_explicit:
                        raise
                    if rate == 0.5:
                        self._limited(stacklevel=8)
                    break
                h = h_new
            interval = h
        self.spacing = float(interval)
        self.setup_seconds = time.perf_counter() - t0

    def _discretise(self, labels, per_comp, h):
        """One :class:`_BranchState` per label; grids are laid out now (size errors raise
        here), the PLDs themselves are built when a query needs them."""
        branches = []
        for label in labels:
            pairs = []
            for (m, k), bl in zip(self._eff, per_comp):
                # a mechanism without this direction contributes its only branch
                b = next((b for b in bl if b.label == label), bl[0])
                pairs.append((b.upper, b.lower))
            cap = self._bins()
            if self._spacing_opt is None and not self._bins_explicit:
                cap = min(cap, AUTO_STEP_POINTS)  # the time budget (automatic grid only)
            elif self._spacing_opt is not None:
                # discretising a step peaks at about GRID_BYTES_PER_POINT per grid point: an explicit
                # grid beyond the memory budget is refused before it is built
                cap = min(cap, max(16, self.memory_budget // GRID_BYTES_PER_POINT))
            try:
                src = _Discretised(pairs, h, self.tail, cap, self.discretisation, self.upper_only)
            except GridTooLargeError as e:
                if self._spacing_opt is None or cap >= self._bins():
                    raise
                raise GridTooLargeError(
                    f"{e} -- the limit is the memory budget's ({self.memory_budget:,} bytes at about "
                    f"{GRID_BYTES_PER_POINT} bytes per point while a step is discretised): use a coarser "
                    "interval or a larger memory_budget", need=e.need, limit=e.limit) from None
            branches.append(_BranchState(label, src, [k for _, k in self._eff]))
        return branches

    def _probe_width(self, delta: float = 1e-5) -> float:
        """Relative width of the eps interval at ``delta`` (0 if it cannot be probed, NaN if
        its composition exceeds ``max_bins``)."""
        try:
            l, u = self._epsilon(np.array([delta]))
            lo, up = float(l[0]), float(u[0])
        except GridTooLargeError:
            return math.nan
        except (ArithmeticError, MemoryError, ValueError):
            return 0.0
        if not (math.isfinite(lo) and math.isfinite(up)):
            return 0.0
        return (up - lo) / max(abs(up), 0.1)
