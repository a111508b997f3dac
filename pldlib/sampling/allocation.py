"""Random allocation ("balls in bins") and shuffling: every record in exactly one of
the t = 1/q batches of an epoch (docs/MATH.md section 13).

``steps`` counts steps and must be a whole number of epochs of t = 1/q steps
(:meth:`SamplingScheme.steps_multiple`, checked by every accountant's ``compose``).

Gaussian noise (sum query of sensitivity 1, noise sigma per step); random allocation also takes any
other noise with a remove pair in the PLD accountant (:class:`CoordinateLaw`, MATH 13.9), and k of the
t steps per epoch (``Sampled.selections``, MATH 13.8).

| side  | random allocation                                        | shuffle                         |
|-------|----------------------------------------------------------|---------------------------------|
| upper | PLD accountant (add, remove, add_remove): a lattice pair dominating one epoch (:func:`allocation_epoch_pair`, MATH 13.2), composed once per epoch; other accountants, substitution, or a lattice too large: no amplification (unsampled Gaussian, sigma sqrt(t) per step) | no amplification |
| lower | PLD accountant: a lattice pair dominated by one epoch (:func:`allocation_epoch_lower_pair`, MATH 13.3); otherwise: unsampled Gaussian, sigma t per step = Gaussian sigma sqrt(t) per epoch, the exact law of the sum of the t noisy batch sums (a post-processing) | PLD accountant: the same dominated pair (MATH 13.4: the zero-dataset shuffled epoch is the random-allocation pair); substitution, other accountants or too large: the epoch sum |

The PLD accountant's per-epoch upper pair is the better of the amplified pair and the unamplified
Gaussian per epoch (:func:`allocation_epoch_upper`, MATH 13.5), and its ``delta`` / ``epsilon`` answers
take the better of its own bounds and the unamplified closed forms on each side
(:func:`with_unamplified`: upper = the smaller, lower = the larger).

With t = 2 steps per epoch and Gaussian noise (add, remove, add_remove) the epoch's pair is known
exactly: a Gaussian pair composed with a symmetric two-component mixture (:func:`two_step_epoch_pieces`,
MATH 13.13); the PLD and PRV accountants compose it on both sides.

The per-step pairs compose *exactly* to the per-epoch statements (Gaussian pairs compose by
adding mu^2), which is why the per-step bounds are only valid at whole epochs.  The lattice
pairs are per-epoch pairs: the PLD accountant composes them once per epoch
(:meth:`RandomAllocation.epoch_branches`, :func:`pldlib.methods.schedule.epoch_components`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import _deadline, events as E
from ..profiles.pairs import Branch, UnsupportedEventError, unsampled_branches
from .base import SamplingScheme, register


def epoch_length(q: float, selections: int = 1) -> int:
    """t = k/q (k = ``selections``, 1: t = 1/q), which must be a whole number above k (ValueError naming
    q otherwise)."""
    k = int(selections)
    t = round(k / q)
    if k == 1 and (t < 2 or abs(t * q - 1.0) > 1e-9):
        raise ValueError(f"q: random allocation / shuffle need q = 1/t for a whole number t >= 2 "
                         f"(batches per epoch), got q={q!r}")
    if k > 1 and (t <= k or abs(t * q - k) > 1e-9 * k):
        raise ValueError(f"q: k of t random allocation (selections={k}) needs q = k/t for a whole number "
                         f"t > k (steps per epoch), got q={q!r}")
    return t


def allocation_blocks(t: int, k: int) -> dict[int, int]:
    """{block size: how many}: t steps cut into k blocks of sizes floor(t/k) and ceil(t/k) (docs/MATH.md
    13.8: k of t random allocation is dominated by one uniform step in each block, the blocks composed)."""
    a, r = divmod(int(t), int(k))
    out = {a: k - r}
    if r:
        out[a + 1] = r
    return out


class RandomAllocation(SamplingScheme):
    name = "random_allocation"
    summary = "each record in exactly one (or k) of the t = 1/q (k/q) steps of an epoch, uniformly"
    relations = ("add", "remove", "add_remove", "substitution")
    takes_selections = True

    def steps_multiple(self, q: float, selections: int = 1) -> int:
        return epoch_length(q, selections)

    def branches(self, event, q, relation, selections: int = 1):
        """Per-step pairs valid over whole epochs (docs/MATH.md 13, 13.8): upper = the unsampled
        Gaussian at sigma sqrt(t/k) (an epoch: the record in k steps, mu^2 = k / sigma^2), lower = the
        unsampled Gaussian at sigma t/k (the epoch sum N(k, t sigma^2), a post-processing).  Gaussian
        noise only: other noises are accounted per epoch by the PLD accountant (MATH 13.9)."""
        k = int(selections)
        t = epoch_length(q, k)
        if not isinstance(event, E.GaussianEvent):
            raise UnsupportedEventError(
                f"sampling {self.name!r} with {type(event).__name__} noise is accounted per epoch by the PLD "
                f"accountant only (method 'pld', relations add, remove, add_remove); other methods and "
                f"substitution take Gaussian noise only")
        s = event.sigma
        up = unsampled_branches(E.GaussianEvent(s * math.sqrt(t / k), event.sensitivity), relation)
        lo = unsampled_branches(E.GaussianEvent(s * t / k, event.sensitivity), relation)
        return [Branch(f"{u.label}", u.upper, l.lower) for u, l in zip(up, lo)]

    def epoch_pieces(self, event, q, relation, selections: int = 1):
        """k = 1: t = 2 with Gaussian noise (add, remove, add_remove): the epoch's exact pair as two
        pieces (:func:`two_step_epoch_pieces`, MATH 13.13); otherwise :meth:`epoch_branches` once
        per epoch.  k > 1 (docs/MATH.md 13.8): upper = the
        composition of one amplified epoch pair per block (:func:`allocation_blocks`: sizes
        floor(t/k), ceil(t/k); a block of one step is the unsampled Gaussian), lower = the dominated
        pair of :func:`allocation_epoch_lower_pair` with k selections (else the epoch sum: Gaussian at
        sigma sqrt(t)/k), carried by the first piece, the others composing a null pair on the lower
        side.  None (per-step bounds) under substitution, for other noises, or when a block's lattice
        does not fit."""
        k = int(selections)
        if k == 1:
            exact = two_step_epoch_pieces(event, q, relation)
            return exact if exact is not None else super().epoch_pieces(event, q, relation)
        t = epoch_length(q, k)
        if relation == "substitution":
            return None
        gaussian = isinstance(event, E.GaussianEvent)
        if gaussian:
            one = unsampled_branches(E.GaussianEvent(event.sigma, event.sensitivity), "add_remove")[0].upper
            one = (one, one)
        else:  # (any other noise: its remove pair and the reverse, MATH 13.9)
            inner = coordinate_law(event).profile
            one = (inner, inner.reversed())
        ups = []
        try:
            for size, count in sorted(allocation_blocks(t, k).items()):
                if size == 1:
                    pair = one
                elif gaussian:
                    pair = allocation_epoch_upper(event.sigma, size)
                else:
                    amp = allocation_epoch_amplified(event, size)
                    pair = (amp, amp.reversed())
                ups.append((pair, count))
        except LatticeTooLarge:
            if gaussian:
                return None
            ups = [(one, k)]  # (unamplified: the record in k steps of the epoch)
        null = null_profile()
        try:
            lo_rem = allocation_epoch_lower_pair(event.sigma if gaussian else event, t, k).profile
            lo_add = lo_rem.reversed()
        except LatticeTooLarge:  # the epoch-sum lower bound: N(k, t sigma^2) per epoch (other noises: none)
            lo_rem = lo_add = (unsampled_branches(E.GaussianEvent(event.sigma * math.sqrt(t) / k, event.sensitivity),
                                                  "add_remove")[0].lower if gaussian else null)

        def piece(up, lo):
            rem, add = Branch("remove", up[0], lo[0]), Branch("add", up[1], lo[1])
            return {"remove": [rem], "add": [add], "add_remove": [add, rem]}[relation]

        (first, n1), rest = ups[0], ups[1:]
        out = [(piece(first, (lo_rem, lo_add)), 1)]
        if n1 > 1:
            out.append((piece(first, (null, null)), n1 - 1))
        out.extend((piece(up, (null, null)), c) for up, c in rest)
        return out

    def exact_epoch_pieces(self, event, q, relation, selections: int = 1):
        """t = 2 (one selection) with Gaussian noise: :func:`two_step_epoch_pieces`; else None."""
        return two_step_epoch_pieces(event, q, relation) if int(selections) == 1 else None

    def epoch_branches(self, event, q, relation, selections: int = 1):
        """Per-epoch branches (one epoch = t steps) with the upper pairs of :func:`allocation_epoch_upper`
        (the better of the amplified pair of :func:`allocation_epoch_profile` and the unamplified
        Gaussian, MATH 13.5) and the dominated lower pair of
        :func:`allocation_epoch_lower_pair` (or, where its FFT does not fit, the epoch-sum lower pair:
        unsampled Gaussian at sigma sqrt(t)); other noises: :meth:`_other_noise_branches`; None (use
        :meth:`branches` per step) under substitution, for a user-level step, or when the lattice
        would be too large (:data:`MAX_LATTICE`)."""
        if selections != 1:
            return None  # (k of t: :meth:`epoch_pieces`)
        t = epoch_length(q)
        if relation == "substitution":
            return None
        if not isinstance(event, E.GaussianEvent):
            return self._other_noise_branches(event, t, relation)
        try:
            up_rem, up_add = allocation_epoch_upper(event.sigma, t)
        except LatticeTooLarge:
            return None
        try:
            lo_rem = allocation_epoch_lower_pair(event.sigma, t).profile
            lo_add = lo_rem.reversed()
        except LatticeTooLarge:  # the epoch-sum lower bound (13)
            lo_rem = lo_add = unsampled_branches(E.GaussianEvent(event.sigma * math.sqrt(t), event.sensitivity),
                                                 "add_remove")[0].lower
        rem = Branch("remove", up_rem, lo_rem)
        add = Branch("add", up_add, lo_add)
        return {"remove": [rem], "add": [add], "add_remove": [add, rem]}[relation]

    @staticmethod
    def _other_noise_branches(event, t, relation):
        """Per-epoch branches of random allocation with non-Gaussian noise (docs/MATH.md 13.9): upper =
        the amplified lattice pair built from the noise's remove pair (:func:`allocation_epoch_amplified`;
        where no lattice fits, the noise's own pair: the record in one step), add = its reverse;
        lower = the dominated pair of :func:`allocation_epoch_lower_pair` (where it does not fit, the
        null pair)."""
        law = coordinate_law(event)
        try:
            up_rem = allocation_epoch_amplified(event, t)
        except LatticeTooLarge:
            up_rem = law.profile
        try:
            lo_rem = allocation_epoch_lower_pair(event, t).profile
        except LatticeTooLarge:
            lo_rem = null_profile()
        rem = Branch("remove", up_rem, lo_rem)
        add = Branch("add", up_rem.reversed(), lo_rem.reversed())
        return {"remove": [rem], "add": [add], "add_remove": [add, rem]}[relation]


class Shuffle(RandomAllocation):
    """Fixed-size batches of a shuffled epoch.  Under add / remove the absent record's
    slot is left empty (the others keep their batches); substitution is the natural
    relation.  Certified range: the upper bound without amplification (it uses only "in
    exactly one batch per epoch"); the lower bound of random allocation's dominated epoch
    pair (docs/MATH.md 13.4: with the other records contributing 0, a shuffled epoch *is*
    the random-allocation epoch pair), else the sum over the epoch."""

    name = "shuffle"
    summary = "fixed-size batches from a shuffled epoch (t = 1/q batches)"
    takes_selections = False

    def branches(self, event, q, relation):
        if not isinstance(event, E.GaussianEvent):
            raise UnsupportedEventError(f"sampling {self.name!r} is implemented for Gaussian noise only, "
                                        f"got {type(event).__name__}")
        return super().branches(event, q, relation)

    def epoch_branches(self, event, q, relation):
        """Per-epoch branches: upper = the unsampled Gaussian pair at sigma (one epoch, the record
        in exactly one batch: no amplification); lower = the dominated lattice pair of
        :func:`allocation_epoch_lower_pair` (remove; add: its reverse), a lower bound for shuffling
        too (MATH 13.4).  None (the per-step bounds) under substitution, for other noises, or when
        that pair does not fit (:class:`LatticeTooLarge`)."""
        t = epoch_length(q)
        if relation == "substitution" or not isinstance(event, E.GaussianEvent):
            return None
        try:
            lo_rem = allocation_epoch_lower_pair(event.sigma, t).profile
        except LatticeTooLarge:
            return None
        # (the Gaussian pair is symmetric: one profile for both directions)
        up = unsampled_branches(E.GaussianEvent(event.sigma, event.sensitivity), "add_remove")[0].upper
        rem = Branch("remove", up, lo_rem)
        add = Branch("add", up, lo_rem.reversed())
        return {"remove": [rem], "add": [add], "add_remove": [add, rem]}[relation]


    def exact_epoch_pieces(self, event, q, relation, **kw):
        return None  # (the upper side is not the epoch's pair)

    def epoch_pieces(self, event, q, relation, **kw):
        """As :meth:`epoch_branches`, except at t = 2 with Gaussian noise (add, remove, add_remove):
        the lower side is then random allocation's exact epoch pair (MATH 13.13, a lower bound for
        shuffling by MATH 13.4), the upper side the unamplified Gaussian."""
        exact = two_step_epoch_pieces(event, q, relation)
        if exact is None:
            return super().epoch_pieces(event, q, relation, **kw)
        up = unsampled_branches(E.GaussianEvent(event.sigma, event.sensitivity), "add_remove")[0].upper
        null = null_profile()
        out = []
        for (branches, count), upper in zip(exact, (up, null)):
            out.append(([Branch(br.label, upper, br.lower) for br in branches], count))
        return out


def two_step_epoch_pieces(event, q, relation):
    """Random allocation over t = 2 steps, Gaussian noise: the epoch's pair *exactly*, as two pieces
    composed once per epoch (docs/MATH.md 13.13).  In the coordinates (y1 + y2, y1 - y2) / sqrt(2) the
    remove pair (N(e1) + N(e2)) / 2 against N(0) (noise sigma, sensitivity 1) factorises into the
    Gaussian pair at noise sqrt(2) sigma and the pair (N(b) + N(-b)) / 2 against N(0) at
    b = 1 / (sqrt(2) sigma) in units of sigma (:class:`~pldlib.profiles.mixtures.SymmetricGaussianMixtureProfile`);
    add is the reverse of both.  Upper and lower sides are the same pairs, so the PLD accountant's
    interval is only its discretisation's.  None where this does not apply (t != 2, other noises,
    substitution)."""
    from ..profiles.base import GaussianProfile
    from ..profiles.mixtures import SymmetricGaussianMixtureProfile

    if relation == "substitution" or not isinstance(event, E.GaussianEvent):
        return None
    if round(1.0 / q) != 2 or abs(2.0 * q - 1.0) > 1e-9:
        return None
    s = float(event.sigma)
    gauss = GaussianProfile(s * math.sqrt(2.0))
    mix_rem = SymmetricGaussianMixtureProfile(1.0 / (math.sqrt(2.0) * s))
    mix_add = mix_rem.reversed()

    def piece(rem_prof, add_prof):
        rem, add = Branch("remove", rem_prof, rem_prof), Branch("add", add_prof, add_prof)
        return {"remove": [rem], "add": [add], "add_remove": [add, rem]}[relation]

    return [(piece(gauss, gauss), 1), (piece(mix_rem, mix_add), 1)]


register(RandomAllocation())
register(Shuffle())


# -- the stronger per-epoch lower bound: the largest noisy coordinate -----------------------
from ..profiles.base import PrivacyProfile  # noqa: E402


class MaxCoordinateProfile(PrivacyProfile):
    """Remove-direction pair of M = max of the t noisy batch sums of one epoch (one record,
    sensitivity 1, noise s = sigma): P(M <= m) = Phi(m/s)^(t-1) Phi((m-1)/s) against
    Q(M <= m) = Phi(m/s)^t (docs/MATH.md section 13).  An exact post-processing of the
    random-allocation (or shuffled-epoch) pair, so composing it (optimistic PLD side) over
    epochs certifies a **lower** bound.  The loss L(m) = log(((t-1)/t) Phi((m-1)/s)/Phi(m/s)
    + exp((2m-1)/(2 s^2))/t) is increasing in m (Phi log-concave); it is inverted by
    bisection to float precision."""

    def __init__(self, sigma: float, t: int):
        self.s, self.t = float(sigma), int(t)

    def _loss(self, m):
        from scipy.special import log_ndtr

        s, t = self.s, self.t
        a = math.log((t - 1) / t) + log_ndtr((m - 1) / s) - log_ndtr(m / s)
        b = -math.log(t) + (2 * m - 1) / (2 * s * s)
        return np.logaddexp(a, b)

    def _m(self, eps):
        eps = np.atleast_1d(np.asarray(eps, dtype=float))
        s2, w = self.s ** 2, 10 * self.s ** 2 * (1 + math.log(self.t)) + 10
        e = np.clip(eps, -700, 700)
        lo, hi = s2 * e - w, s2 * e + w
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            big = self._loss(mid) > e
            hi = np.where(big, mid, hi)
            lo = np.where(big, lo, mid)
            if np.all(hi - lo <= 2 * np.finfo(float).eps * np.maximum(1.0, np.abs(mid))):
                break  # float precision reached: further halvings change nothing
        m = 0.5 * (lo + hi)
        return np.where(eps == np.inf, np.inf, np.where(eps == -np.inf, -np.inf, m))

    @staticmethod
    def _shape(eps, r):
        return r.reshape(np.shape(eps)) if np.ndim(eps) else float(r[0])

    def _logcdf(self, m, under_p):
        from scipy.special import log_ndtr

        s, t = self.s, self.t
        if under_p:
            return (t - 1) * log_ndtr(m / s) + log_ndtr((m - 1) / s)
        return t * log_ndtr(m / s)

    def cdf_p(self, eps):
        return self._shape(eps, np.exp(self._logcdf(self._m(eps), True)))

    def cdf_q(self, eps):
        return self._shape(eps, np.exp(self._logcdf(self._m(eps), False)))

    def sf_p(self, eps):
        return self._shape(eps, -np.expm1(self._logcdf(self._m(eps), True)))

    def sf_q(self, eps):
        return self._shape(eps, -np.expm1(self._logcdf(self._m(eps), False)))


# -- the amplified per-epoch upper bound (docs/MATH.md 13.2) --------------------------------
import functools  # noqa: E402

from ..profiles.base import FiniteProfile, cell_errors, value_error  # noqa: E402

_U = np.finfo(float).eps / 2
#: largest lattice (points of one coordinate, or of an epoch sum) built before falling back
#: to the unamplified bound
MAX_LATTICE = 1 << 22
#: lattice spacing of one coordinate, in standard deviations of its likelihood ratio
SPACING = 0.02
#: per-coordinate mass E[(Y - a_top)_+] sent to the +inf atom (the top of the lattice): the first
#: of these whose lattice fits (a larger one only adds to P(+inf) per epoch)
TOP_TAILS = (1e-12, 1e-10)
#: partial sums are cut where their (significant) tail Q-mass and mean contribution fall below this
CUT_TAIL = 1e-15


class LatticeTooLarge(ValueError):
    """The amplified epoch pair would need a lattice beyond :data:`MAX_LATTICE` points."""


class CoordinateLaw:
    """The law under Q of one coordinate's likelihood ratio Y = dP0/dQ0 (docs/MATH.md 13.2, 13.9), from
    the remove-direction pair (P0, Q0) of one unsampled step of ``event``: ``parts(a)`` gives, at
    points a >= 0, (G, Gb, F, Fb) with G(a) = E_Q[Y; Y <= a] = P0(L <= ln a), Gb(a) = E_Q[Y; Y > a]
    = P0(ln a < L < inf), F(a) = Q0(Y <= a) and Fb(a) = Q0(Y > a), read off the pair's loss law
    (every value within :func:`~pldlib.profiles.base.value_error`, pldlib's accuracy model).
    ``sd`` estimates sd(Y) (it only sets lattice spacings, never a bound); ``top`` bounds Y's support
    (+inf if unbounded).  The Gaussian law (``event`` a :class:`~pldlib.events.GaussianEvent`) is
    in closed form with ndtr, as before."""

    def __init__(self, event):
        from ..profiles.pairs import unsampled_branches

        self.event = event
        self.gaussian = isinstance(event, E.GaussianEvent)
        if self.gaussian:
            s = event.sigma
            self.sigma = s
            self.p_inf = 0.0
            self.sd = math.sqrt(math.expm1(min(1.0 / s ** 2, 700.0)))
            self.top = math.inf
            return
        br = unsampled_branches(event, "remove")
        if len(br) != 1:
            raise UnsupportedEventError(f"random allocation: {type(event).__name__} has no single remove pair")
        self.profile = br[0].upper
        self.p_inf = float(self.profile.p_inf)
        sup = float(self.profile.loss_sup())
        self.top = math.exp(sup) if sup < 700 else math.inf
        self.sd = self._sd()

    def _sd(self) -> float:
        """sd(Y) under Q: E_Q Y^2 = E_P0[e^L; L finite], by numerical integration of
        2 a Q(Y > a) over a (an estimate: it only sets the lattice spacing)."""
        from scipy import integrate

        pr = self.profile
        hi = self.top if math.isfinite(self.top) else math.exp(min(pr.eps_bounds(1e-14)[1], 700.0))

        def f(a):
            return 2.0 * a * float(np.asarray(pr.sf_q(np.log(a))).ravel()[0]) if a > 0 else 0.0

        pts = [x for x in (1.0, hi / 2) if 0 < x < hi]
        m2 = integrate.quad(f, 0.0, hi, points=pts or None, limit=400)[0]
        mean = 1.0 - self.p_inf
        return math.sqrt(max(m2 - mean * mean, 1e-6))

    def __hash__(self):
        return hash(self.event)

    def __eq__(self, other):
        return isinstance(other, CoordinateLaw) and other.event == self.event

    def parts(self, a):
        """(G, Gb, F, Fb) at the points ``a`` (array, >= 0)."""
        a = np.asarray(a, dtype=float)
        if self.gaussian:
            from scipy.special import ndtr

            s = self.sigma
            c = 0.5 / s
            with np.errstate(divide="ignore"):
                la = np.log(a)
            # F(y) = Q(Y <= y) = Phi(s ln y + c); G(y) = E_Q[Y; Y <= y] = P(Y <= y) = Phi(s ln y - c)
            return ndtr(s * la - c), ndtr(c - s * la), ndtr(s * la + c), ndtr(-c - s * la)
        pr = self.profile
        pos = a > 0
        la = np.log(np.where(pos, a, 1.0))
        G = np.where(pos, pr.cdf_p(la), 0.0)
        Gb = np.where(pos, np.maximum(pr.sf_p(la) - self.p_inf, 0.0), 1.0 - self.p_inf)
        F = np.where(pos, pr.cdf_q(la), 0.0)
        Fb = np.where(pos, pr.sf_q(la), 1.0)
        return G, Gb, F, Fb


@functools.lru_cache(maxsize=64)
def coordinate_law(event) -> CoordinateLaw:
    """The (cached) :class:`CoordinateLaw` of ``event``."""
    return CoordinateLaw(event)


def _law(x) -> CoordinateLaw:
    """A :class:`CoordinateLaw` from a law, an event, or a Gaussian noise multiplier sigma."""
    if isinstance(x, CoordinateLaw):
        return x
    if isinstance(x, E.BaseEvent):
        return coordinate_law(x)
    return coordinate_law(E.GaussianEvent(float(x)))


def _law_and_sigma(x) -> tuple[CoordinateLaw, float]:
    """(law, sigma) of a Gaussian noise multiplier (validated) or of a law / event (sigma: NaN unless
    Gaussian)."""
    if isinstance(x, (CoordinateLaw, E.BaseEvent)):
        law = _law(x)
        return law, (law.sigma if law.gaussian else math.nan)
    from .. import _validate as V

    s = V.positive_finite("sigma", x)
    return _law(s), s


def _fft_eta(L: int) -> float:
    """Relative l2 error of one real FFT of length L (a power of 2): Higham's bound
    (Accuracy and Stability of Numerical Algorithms, 2nd ed., Thm 24.2) log2(L) eta with
    eta = mu + gamma_4 (sqrt 2 + mu) < 7u for twiddle factors accurate to mu <= u, taken as
    8u per level, with two extra levels for the real-to-complex packing."""
    return 8 * _U * (math.log2(L) + 2)


def coordinate_lattice(sigma: float, h: float, top_tail: float = TOP_TAILS[0]):
    """(beta, a_top_index, alpha): the pmf beta[k] = Q(Y' = k h), k = 0..K, of a lattice variable
    Y' <=_icv Y, where Y = exp(Z/sigma - 1/(2 sigma^2)) (Z ~ N(0,1)) is the likelihood ratio of
    one coordinate (N(1, s^2) against N(0, s^2)) under Q (docs/MATH.md 13.2).

    Y' is the mean-preserving spread of Y onto the lattice below K h (beta = second differences
    of M(a) = E[min(Y, a)]), and K h for Y > K h, where K is the first lattice index with
    alpha = E[(Y - K h)_+] <= top_tail; then every mass is shrunk by a verified factor
    (1 - lambda_0) (the freed mass goes to 0) so that E[min(Y', a_j)] <= E[min(Y, a_j)] holds at
    every lattice point despite round-off, hence for every a (both sides are concave between
    lattice points and the left one is linear there).  Raises :class:`LatticeTooLarge`.

    ``sigma`` may also be a :class:`CoordinateLaw` (or an event): any other noise (docs/MATH.md 13.9);
    a bounded Y's lattice stops at its support's top."""
    law = _law(sigma)
    parts = law.parts
    name = f"sigma={law.sigma:g}" if law.gaussian else type(law.event).__name__

    a = max(1.0, h)
    while True:
        G, Gb, F, Fb = parts(np.array([a]))
        if Gb[0] - a * Fb[0] <= top_tail or a >= law.top:
            break
        a *= 1.25
        if a / h > MAX_LATTICE:
            raise LatticeTooLarge(f"{name}: one coordinate would need more than {MAX_LATTICE} lattice points")
    K = max(2, int(math.ceil(a / h)))
    ak = h * np.arange(K + 2)
    G, Gb, F, Fb = parts(ak)
    M = G + ak * Fb          # E[min(Y, a)], accurate where it is not close to 1
    C = Gb - ak * Fb         # E[(Y - a)_+] = 1 - M, accurate in the upper tail
    j = np.arange(1, K)
    beta = np.empty(K + 1)
    beta[1:K] = np.where(ak[j + 1] <= 1.0, (2 * M[j] - M[j - 1] - M[j + 1]) / h,
                         (C[j - 1] + C[j + 1] - 2 * C[j]) / h)
    beta[K] = (C[K - 1] - C[K]) / h
    np.maximum(beta, 0.0, out=beta)
    beta[0] = 0.0
    beta[0] = max(0.0, 1.0 - beta.sum())
    alpha = float(C[K])
    # verification at the lattice points: lhs_j = E[min(Y', a_j)] against a lower bound on
    # M(a_j) (relative accuracy of ndtr); the cumulative sums carry at most (K + 2) u relative error
    ak = ak[:K + 1]
    tail = np.cumsum(beta[::-1])[::-1]
    head = np.concatenate([[0.0], np.cumsum(ak * beta)[:-1]])
    lhs = head + ak * tail
    # M = G + a Fbar: two terms >= 0, each within its value_error (ndtr values)
    m_lo = M[:K + 1] * (1 - 4 * _U) - (value_error(G[:K + 1]) + ak * value_error(Fb[:K + 1])) * (1 + 4 * _U)
    with np.errstate(divide="ignore", invalid="ignore"):
        viol = np.where(lhs > 0, np.maximum(lhs - m_lo, 0.0) / lhs, 0.0)
    lam0 = float(viol.max()) + 4 * (K + 2) * _U
    if not lam0 < 1e-6:
        raise ArithmeticError(f"random allocation lattice: the verification failed (lambda_0 = {lam0:.3g})")
    beta *= 1.0 - lam0
    beta[0] += max(0.0, 1.0 - beta.sum())
    return beta, K, alpha, lam0


def _convolve(a, ea, b, eb, terms, h):
    """(c, ec): a * b by FFT at a power-of-2 length >= len(a) + len(b) - 1 (no wrap-around),
    negatives clipped, cut above the significant tail; ec bounds ||c - (a_exact * b_exact)
    restricted to the kept indices||_2 given ||a - a_exact||_2 <= ea, ||b - b_exact||_2 <= eb
    (docs/MATH.md 13.2)."""
    from numpy.fft import irfft, rfft

    _deadline.check("the random-allocation lattice")  # (each convolution: up to ~0.5 s)
    n = len(a) + len(b) - 1
    L = 1 << (n - 1).bit_length()
    if L > 2 * MAX_LATTICE:
        raise LatticeTooLarge(f"an epoch sum would need an FFT of {L} points")
    full = irfft(rfft(a, L) * rfft(b, L), L)
    c = full[:n]
    noise = float(np.abs(full[n:]).max()) if L > n else _U * float(np.abs(c).max())
    l1a, l1b = float(a.sum()) + math.sqrt(len(a)) * ea, float(b.sum()) + math.sqrt(len(b)) * eb
    l2a, l2b = float(np.sqrt((a * a).sum())) + ea, float(np.sqrt((b * b).sum())) + eb
    et = _fft_eta(L)
    # inputs' errors (Young: ||x * y||_2 <= ||x||_2 ||y||_1), the two forward transforms, the
    # pointwise product (complex multiplication: < 4u), then the inverse transform
    err = ea * l1b + eb * l1a + ea * eb + et * (l2a * l1b + l1a * l2b) + 4 * _U * l1a * l2b
    np.maximum(c, 0.0, out=c)  # the exact values are >= 0: clipping only moves closer
    err += et * (float(np.sqrt((c * c).sum())) + err)
    err *= 1.0 + 8.0 * et      # second-order terms
    # the cut is free for soundness (dropping mass of a partial sum lowers every mass of the final
    # law, convolution being monotone; +inf takes the complement); entries at the FFT noise level
    # are ignored when placing it
    sig = np.where(c > 4.0 * noise, c, 0.0)
    tq = np.cumsum(sig[::-1])[::-1]
    tp = np.cumsum((np.arange(n) * sig)[::-1])[::-1] * (h / terms)
    ok = (tq <= CUT_TAIL) & (tp <= CUT_TAIL)
    cut = max(int(np.argmax(ok)) if ok.any() else n, 1)
    return c[:cut].copy(), err


class AllocationEpochPair(NamedTuple):
    """The amplified per-epoch pair and its certificate numbers (docs/MATH.md 13.2)."""

    profile: FiniteProfile
    sigma: float
    t: int
    h: float          # lattice spacing of one coordinate's likelihood ratio
    alpha: float      # per-coordinate mass sent to +inf at the top of the lattice
    lambda0: float    # verified shrink factor of one coordinate's pmf
    l2_error: float   # bound on the l2 round-off of the epoch-sum pmf
    lam: float        # shrink factor covering that round-off
    points: int       # atoms of the epoch pair
    seconds: float


@functools.lru_cache(maxsize=16)
def allocation_epoch_pair(sigma: float, t: int, spacing: float = SPACING,
                          top_tails: tuple = TOP_TAILS) -> AllocationEpochPair:
    """The certified amplified upper pair of one epoch of random allocation (remove direction;
    its reverse dominates the add direction), docs/MATH.md 13.2.

    Q-law of the epoch likelihood ratio S' = (Y'_1 + ... + Y'_t)/t on the lattice (h/t) N, with
    Y'_j iid :func:`coordinate_lattice` variables, computed by binary powering with FFT
    convolutions (no wrap-around, l2 round-off tracked), masses shrunk by (1 - lambda) to cover
    the round-off; P = S' Q on the atoms and P(+inf) = 1 - E[S'].  Proven:
    E[min(S', g)] <= E[min(S, g)] for all g >= 0, i.e. the pair dominates the true epoch pair
    in both directions.  Raises :class:`LatticeTooLarge` beyond :data:`MAX_LATTICE` points."""
    import time

    t0 = time.perf_counter()
    from .. import _validate as V

    law, s = _law_and_sigma(sigma)
    t = int(t)
    if t < 2:
        raise ValueError(f"t: random allocation needs t >= 2 steps per epoch, got {t}")
    spacing = V.positive_finite("spacing", spacing)
    h = spacing * law.sd
    if not math.isfinite(h) or h <= 0:
        raise LatticeTooLarge(f"sigma={s:g}: the likelihood ratio's spread overflows")
    for i, top in enumerate(top_tails):
        try:
            beta, K, alpha, lam0 = coordinate_lattice(law, h, top)
            break
        except LatticeTooLarge:
            if i == len(top_tails) - 1:
                raise
    # binary powering: res = sum of `rm` coordinates, base = sum of `bm` coordinates
    res, re, rm = None, 0.0, 0
    base, be, bm = beta, 0.0, 1
    e = t
    while e:
        if e & 1:
            if res is None:
                res, re, rm = base, be, bm
            else:
                res, re = _convolve(res, re, base, be, rm + bm, h)
                rm += bm
        e >>= 1
        if e:
            base, be = _convolve(base, be, base, be, 2 * bm, h)
            bm *= 2
    q, e2 = res, re
    sk = h * np.arange(len(q)) / t
    # final cut: dropped mass (to the complements) against the round-off allowance ~ e2 ||s||_2
    tp = np.cumsum((sk * q)[::-1])[::-1]
    tq = np.cumsum(q[::-1])[::-1]
    s2 = np.concatenate([[0.0], np.cumsum(sk * sk)[:-1]])
    if not law.gaussian:  # (a bounded Y may end on an atom of real mass: keeping everything is allowed)
        tp, tq, s2 = np.append(tp, 0.0), np.append(tq, 0.0), np.append(s2, s2[-1] + sk[-1] ** 2)
    j = max(int(np.argmin(tp + tq + e2 * np.sqrt(s2))), 3)
    q, sk = q[:j], sk[:j]
    n = len(q)
    # lambda >= sup_g ||min(s, g)||_2 e2 / sum_k min(s_k, g) q_k: both increasing in g, so on
    # (s_i, s_{i+1}] the ratio is at most num(i+1) / den(i); on (0, s_1] it is constant
    qt = np.cumsum(q[::-1])[::-1]
    sq = np.concatenate([[0.0], np.cumsum(sk * q)[:-1]])
    den = (sq + sk * qt) * (1 - 4 * (n + 2) * _U)
    num = np.sqrt(s2[:n] + sk * sk * (n - np.arange(n))) * (1 + 4 * (n + 2) * _U)
    ratio = np.concatenate([[num[1] / den[1]], num[2:] / np.maximum(den[1:-1], 1e-300)])
    lam = e2 * float(ratio.max()) + 64 * _U
    if not lam < 1e-4:
        raise ArithmeticError(f"random allocation epoch pair: round-off allowance {lam:.3g} too large")
    w = q[1:] * (1.0 - lam)
    p = sk[1:] * w
    keep = p > 0
    p_inf = max(0.0, 1.0 - float(p[keep].sum()))
    prof = FiniteProfile(np.log(sk[1:][keep]), p[keep], p_inf)
    return AllocationEpochPair(prof, s, t, h, alpha, lam0, e2, lam, int(keep.sum()), time.perf_counter() - t0)


def allocation_epoch_profile(sigma: float, t: int) -> FiniteProfile:
    """The profile (remove direction) of :func:`allocation_epoch_pair`."""
    return allocation_epoch_pair(float(sigma), int(t)).profile


# -- the certified lower pair: quantise each coordinate, add the cell indices (MATH 13.3) -------
#: lattice spacings tried for the lower pair (in sd(Y)), finest first, until the FFT fits
LOWER_SPACINGS = (0.02, 0.05, 0.1)
#: the top cell [a_K, inf) of a coordinate starts where its P-tail mass falls below this
LOWER_TOP = 1e-10
#: largest FFT length of the lower pair (one real array of this length is 64 MiB)
MAX_LOWER_FFT = 1 << 23


def coordinate_cells(sigma, h: float, K: int, edges=None):
    """(m, p, e_m, e_p): the Q- and P-masses of the cells [k h, (k+1) h), k < K, and [K h, inf) of one
    coordinate's likelihood ratio Y (Q: N(0, s^2), P: N(1, s^2); F = Q-cdf of Y, G = P-cdf of Y), with
    l2 bounds on their evaluation errors (ndtr values within value_error; each mass differenced from the
    cdf or the sf, whichever is below 1/2).  ``sigma`` may be a :class:`CoordinateLaw` (or an event):
    then the cells are (k h, (k+1) h] (the first [0, h], the last (K h, inf], P's +inf atom included),
    from the pair's loss cdfs (docs/MATH.md 13.9).  ``edges`` (increasing, from 0; K + 1 of them)
    replaces the uniform edges k h: any cells give a post-processing (MATH 13.8)."""
    law = _law(sigma)
    a = h * np.arange(K + 1) if edges is None else np.asarray(edges, dtype=float)
    if not law.gaussian:
        G, Gb, F, Fb = law.parts(a)
        # (P: cdf G, sf = Gb + p_inf; at a = 0 the cdfs are 0 and the sfs the totals)
        cdfs = ((F, Fb), (G, Gb + law.p_inf))
    else:
        from scipy.special import ndtr

        s = law.sigma
        c = 0.5 / s
        with np.errstate(divide="ignore"):
            la = np.log(a)
        zF, zG = s * la + c, s * la - c
        cdfs = ((ndtr(zF), ndtr(-zF)), (ndtr(zG), ndtr(-zG)))

    def masses(cs):
        cdf, sf = cs
        use_sf = sf[:-1] < 0.5
        d = np.where(use_sf, sf[:-1] - sf[1:], cdf[1:] - cdf[:-1])
        mag = np.where(use_sf, sf[:-1] + sf[1:], cdf[:-1] + cdf[1:])
        out = np.append(np.maximum(d, 0.0), sf[-1])
        err = np.append(cell_errors(sf, cdf) + 2 * _U * mag, value_error(sf[-1]) + _U * sf[-1])
        return out, float(np.sqrt((err * err).sum()))

    m, em = masses(cdfs[0])
    p, ep = masses(cdfs[1])
    return m, p, em, ep


def _complex_power(z, k: int):
    """z**k by binary powering (relative error of each entry <= 8 k u for k >= 1)."""
    r, b = None, z
    while k:
        if k & 1:
            r = b.copy() if r is None else r * b
        k >>= 1
        if k:
            b = b * b
    return r


class SummedFiniteProfile(FiniteProfile):
    """A :class:`FiniteProfile` whose ``delta`` sums nonnegative terms between sorted query points
    (:func:`_finite_delta_sorted`): O(atoms + points) for many atoms and many points, as the grids of
    the per-epoch pairs need, and at least as accurate."""

    def delta(self, eps):
        """delta(eps) in O(atoms + points) by :func:`_finite_delta_sorted` (nonnegative terms, partial
        sums in extended precision: a few units of round-off, as :meth:`FiniteProfile.delta`)."""
        eps = np.asarray(eps, dtype=float)
        flat = eps.ravel()
        if flat.size == 0 or np.isnan(flat).any():
            return super().delta(eps)
        order = np.argsort(flat, kind="stable")
        e = flat[order]
        # -inf: 800 below every loss and every other point (e^{e - l} underflows to 0, so delta there is the
        # P-total, as at -inf; the points stay sorted)
        fin = e[e > -np.inf]
        e = np.where(e == -np.inf, min(float(self.losses[0]), float(fin[0]) if fin.size else 0.0) - 800.0, e)
        d, _ = _finite_delta_sorted(self.losses, self.p_masses, self.p_inf, e)
        out = np.empty_like(flat)
        out[order] = np.clip(d, 0.0, 1.0)
        return out.reshape(eps.shape)


class DominatedFiniteProfile(SummedFiniteProfile):
    """One direction of a finite pair built to be **dominated** by a true pair (docs/MATH.md 13.3),
    carrying its own reverse direction (:meth:`reversed`): each direction is built from its own
    certain side, so neither gets an atom at +inf from the other's float residual.

    Given atoms with P-masses p_k <= the true ones and losses between 0 and the true ones (in this
    direction), the pair is sound against its float representation (Q-masses p_k e^{-l_k} as
    :class:`FiniteProfile` computes them): the exact sum of p is made <= the exact sum of those Q-masses
    (the masses of the atoms with l_k > 0 scaled down, which keeps their losses), and the deficit
    1 - sum p goes to one atom of loss 0 with sum p + blank <= 1 exactly (``math.fsum``: exact signs).
    Then H_gamma is below the true pair's at every gamma >= 0 (MATH 13.3); the Q-mass left over sits at
    L = -inf, which adds nothing to this direction."""

    @staticmethod
    def _direction(losses, p):
        p = np.array(p, dtype=float)
        pos = losses > 0
        for _ in range(16):
            q = p * np.exp(-losses)  # exactly FiniteProfile's Q-masses
            excess = math.fsum(np.concatenate([p, -q]))
            if excess <= 0.0:
                break
            gap = math.fsum((p - q)[pos])  # > 0: an atom with loss <= 0 has q >= p in floats
            p[pos] *= 1.0 - min(1.0, 2.0 * excess / gap + 8 * _U)
        else:  # pragma: no cover - the scaling converges in one or two rounds
            raise ArithmeticError("dominated pair: the totals could not be balanced")
        blank = max(0.0, (1.0 - math.fsum(p)) - 4 * _U)
        while math.fsum(np.concatenate([p, [blank, -1.0]])) > 0.0:  # pragma: no cover - defensive
            p *= 1.0 - 4 * _U
        return np.append(losses, 0.0), np.append(p, blank)

    @classmethod
    def pair(cls, losses, p, q) -> "DominatedFiniteProfile":
        """The remove-direction profile of atoms with certain masses (p, q) and losses ``losses`` (pulled
        towards 0 from the certain log-ratios); its :meth:`reversed` is the add direction built from
        (-losses, q)."""
        losses = np.asarray(losses, dtype=float)
        fwd = cls(*cls._direction(losses, p))
        rev = cls(*cls._direction(-losses, q))
        fwd._rev, rev._rev = rev, fwd
        return fwd

    def reversed(self) -> "DominatedFiniteProfile":
        return self._rev


class AllocationLowerPair(NamedTuple):
    """The certified lower (dominated) per-epoch pair and its numbers (docs/MATH.md 13.3)."""

    profile: FiniteProfile
    sigma: float
    t: int
    h: float          # cell width of one coordinate's likelihood ratio
    cells: int        # cells per coordinate (the last one [K h, inf))
    fft: int          # FFT length
    err_p: float      # l-infinity bounds on the computed pmfs of the index sum N under P, Q
    err_q: float
    blank: float      # mass sent to the likelihood-ratio-1 atom (uncertain atoms, totals)
    seconds: float
    selections: int = 1  # k: the record in k of the t steps


@functools.lru_cache(maxsize=8)
def allocation_epoch_lower_pair(sigma: float, t: int, selections: int = 1) -> AllocationLowerPair:
    """A pair **dominated by** one epoch of random allocation (remove direction; its reverse is
    dominated by the add direction), docs/MATH.md 13.3 (k > 1 selections: 13.8): quantise each noisy
    batch sum into the cells of its likelihood ratio and release only N = the sum of the t cell
    indices (a post-processing), so Q_N = m^{*t} and P_N = p^{*k} * m^{*(t-k)}; computed by one FFT of length
    >= t K + 1 (no wrap-around) with l2 error bounds, then every atom is moved to the certain side
    (its likelihood ratio only towards 1, its masses only down) and the rest goes to one atom of
    likelihood ratio 1.  Raises :class:`LatticeTooLarge` if no spacing of
    :data:`LOWER_SPACINGS` fits :data:`MAX_LOWER_FFT`."""
    import time

    from numpy.fft import irfft, rfft
    from scipy.special import ndtri

    t0 = time.perf_counter()
    law, s = _law_and_sigma(sigma)
    t = int(t)
    k = int(selections)
    if t < 2:
        raise ValueError(f"t: random allocation needs t >= 2 steps per epoch, got {t}")
    if not 1 <= k < t:
        raise ValueError(f"selections: k of t random allocation needs 1 <= k < t, got k={k}, t={t}")
    sd = law.sd
    if law.gaussian:
        # top cell: P(Y > a_K) = Phi(1/(2s) - s ln a_K) <= LOWER_TOP
        a_top = math.exp((-float(ndtri(LOWER_TOP)) + 0.5 / s) / s)
    else:  # (the first a = 1.25^j with P0(ln a < L < inf) <= LOWER_TOP, or the support's top)
        a_top = 1.0
        while a_top < law.top and float(law.parts(np.array([a_top]))[1][0]) > LOWER_TOP:
            a_top *= 1.25
            if a_top > 1e300:
                raise LatticeTooLarge(f"{type(law.event).__name__}: no finite top cell for the lower pair")
        a_top = min(a_top, law.top)
    for spacing in LOWER_SPACINGS:
        h = spacing * sd
        K = max(2, int(math.ceil(a_top / h)))
        n = t * K + 1
        L = 1 << (n - 1).bit_length()
        if L <= MAX_LOWER_FFT:
            break
    else:
        raise LatticeTooLarge(f"sigma={s:g}, t={t}: the lower pair would need an FFT beyond {MAX_LOWER_FFT} points")
    edges = None
    if k > 1:  # (cells uniform in W = ln(1 - q + q Y), q = k/t: closer to the likelihood ratio for k > 1, MATH 13.8)
        q = k / t
        w = math.log1p(-q) + np.log1p(q * (a_top - 1.0) / (1.0 - q)) * np.arange(K + 1) / K
        edges = np.expm1(w - math.log1p(-q)) * (1.0 - q) / q
        edges[0], edges[-1] = 0.0, a_top
    m, p, em, ep = coordinate_cells(law, h, K, edges)
    eta = _fft_eta(L)
    M, Pf = rfft(m, L), rfft(p, L)
    Mk = _complex_power(M, t - k)
    if k == 1:
        Qn = irfft(Mk * M, L)[:n]
        Pn = irfft(Mk * Pf, L)[:n]
    else:
        Qn = irfft(Mk * _complex_power(M, k), L)[:n]
        Pn = irfft(Mk * _complex_power(Pf, k), L)[:n]
    # l2 error bounds (docs/MATH.md 13.3): the full spectra's errors (Parseval), |M|, |P| <= 1 for
    # the exact pmfs, the powers' propagation and rounding, then the inverse transform
    sq = math.sqrt(L)
    dM = sq * (eta * float(np.sqrt((m * m).sum())) + em)
    dP = sq * (eta * float(np.sqrt((p * p).sum())) + ep)
    bnd = (1.0 + dM + dP) ** t
    rnd = 8 * (t + (2 if k > 1 else 0)) * _U * bnd * sq  # the powers' (and, k > 1, one more product's) rounding
    fq = t * dM * bnd + rnd
    fp = ((t - k) * dM + k * dP) * bnd + rnd
    err_q = (fq / sq + eta * (float(np.sqrt((Qn * Qn).sum())) + fq / sq)) * (1 + 8 * eta)
    err_p = (fp / sq + eta * (float(np.sqrt((Pn * Pn).sum())) + fp / sq)) * (1 + 8 * eta)
    p_lo, p_hi, q_lo, q_hi = Pn - err_p, Pn + err_p, Qn - err_q, Qn + err_q
    ok = (p_lo > 0) & (q_lo > 0)
    A = ok & (p_lo >= q_hi)                # likelihood ratio certainly >= 1
    B = ok & (q_lo >= p_hi) & ~A           # certainly <= 1
    P2, Q2 = np.zeros(n), np.zeros(n)
    Q2[A] = q_lo[A]
    P2[A] = p_lo[A] * (q_lo[A] / q_hi[A])  # ratio p_lo / q_hi <= the true one, >= 1
    P2[B] = p_lo[B]
    Q2[B] = q_lo[B] * (p_lo[B] / p_hi[B])  # inverse ratio q_lo / p_hi <= the true one, >= 1
    TP, TQ = float(P2.sum()), float(Q2.sum())
    if TP > TQ:  # equal totals: lower the excess of A-atoms (their ratios stay in [1, true])
        ex = P2[A] - Q2[A]
        P2[A] = Q2[A] + ex * (1.0 - (TP - TQ) / float(ex.sum()))
    elif TQ > TP:
        ex = Q2[B] - P2[B]
        Q2[B] = P2[B] + ex * (1.0 - (TQ - TP) / float(ex.sum()))
    keep = (P2 > 0) & (Q2 > 0)
    lr = np.log(P2[keep]) - np.log(Q2[keep])
    # the stored losses must not overstate |ln ratio| (their own rounding): pulled towards 0
    margin = 4 * _U * (np.abs(np.log(P2[keep])) + np.abs(np.log(Q2[keep])) + 1.0)
    losses = np.where(lr > 0, np.maximum(lr - margin, 0.0), np.minimum(lr + margin, 0.0))
    # each direction on its own: its certain masses (P'' remove, Q'' add) and losses (MATH 13.3)
    prof = DominatedFiniteProfile.pair(losses, P2[keep], Q2[keep])
    blank = float(prof.p_masses[prof.losses == 0.0].sum())
    return AllocationLowerPair(prof, s, t, h, K + 1, L, err_p, err_q, blank, time.perf_counter() - t0, k)


def null_profile() -> FiniteProfile:
    """The pair of two equal laws (one atom of privacy loss 0): composing it changes nothing."""
    return FiniteProfile(np.zeros(1), np.ones(1), 0.0)


# -- the better of two certified upper pairs, per epoch (docs/MATH.md 13.5) ----------------------
#: spacing (in eps) of the uniform part of the sample points of :func:`min_upper_profile`
MIN_SPACING = 2e-3
#: the samples reach up to where the Gaussian curve is about Phi(-MIN_TOP_Z) (z = 14: 8e-45, below the
#: accountants' own tail truncation of 1e-38 per step); the curve above is its value there (P(+inf))
MIN_TOP_Z = 14.0


def _finite_delta_sorted(losses, p, p_inf, eps):
    """(delta, rel): the curve of the finite pair (sorted ``losses``, P-masses ``p``, ``p_inf``) at the
    increasing points ``eps``, as p_inf plus backward partial sums of nonnegative terms
    (delta(e_k) = delta(e_{k+1}) + (e^{e_{k+1}} - e^{e_k}) Q(L > e_{k+1}) + sum over the atoms in
    (e_k, e_{k+1}] of p_j (1 - e^{e_k - l_j})), and a relative error bound ``rel`` of every value
    (:func:`_sum_rel`: an atom's term within 8u, e_k - l_j being exact (Sterbenz) or well separated; a
    step's term an exp of three logs, off by 2u times their sizes; suffix and partial sums of
    nonnegative terms)."""
    n, m = len(eps), len(losses)
    q = p * np.exp(-losses)
    qsuf = np.concatenate([np.cumsum(q[::-1].astype(np.longdouble))[::-1].astype(float), [0.0]])
    j = np.searchsorted(losses, eps, side="right")        # first atom > e_k
    # atoms in (e_k, e_{k+1}] for k < n - 1, and those above e_{n-1} for the last point
    owner = np.searchsorted(eps, losses, side="left") - 1  # atom l in (e_owner, e_owner+1]
    owner = np.where(owner < 0, -1, owner)
    inside = owner >= 0
    w = np.zeros(n)
    if inside.any():
        o = owner[inside]
        w += np.bincount(o, weights=p[inside] * -np.expm1(eps[o] - losses[inside]), minlength=n)
    step = np.zeros(n)
    qk = qsuf[j[1:]]
    pos = qk > 0
    expo = 0.0  # the largest |exponent part| of a step's term (its rounding, relative, in _sum_rel)
    with np.errstate(over="ignore", divide="ignore"):
        # e^{e_{k+1}} - e^{e_k} = e^{e_{k+1}} (1 - e^{-(e_{k+1} - e_k)}), in logs (no overflow for wide gaps)
        lg, lq = np.log(-np.expm1(-np.diff(eps)[pos])), np.log(qk[pos])
        step[:-1][pos] = np.exp(eps[1:][pos] + lg + lq)
    if lg.size:
        expo = float(np.max(np.abs(eps[1:][pos]) + np.abs(lg) + np.abs(lq)))
    terms = w + step
    terms[-1] = w[-1]  # the last point: its atoms above it only
    d = (np.cumsum(terms[::-1].astype(np.longdouble))[::-1] + p_inf).astype(float)
    return d, _sum_rel(m, n, expo)


def _sum_rel(atoms: int, points: int, expo: float) -> float:
    """Relative error bound of :func:`_finite_delta_sorted` with ``atoms`` atoms and ``points`` points:
    (atoms + points + 16) 2u for the terms and the sums, plus 2u ``expo`` for the exponent of a step's
    term (the largest |e_{k+1}| + |ln(1 - e^{-d})| + |ln Q| summed there: each rounded within u of itself)."""
    return (atoms + points + 16) * 2 * _U + 2 * _U * expo


def min_upper_profile(losses, p, p_inf, gauss_sigma: float, spacing: float = MIN_SPACING) -> "SummedFiniteProfile":
    """A pair dominating every pair that both given pairs dominate: the finite pair (``losses``,
    P-masses ``p``, ``p_inf``) and the Gaussian pair of noise ``gauss_sigma`` (docs/MATH.md 13.5).

    Its curve (in gamma = e^eps) is the lower convex hull of the points (gamma_k, w_k),
    w_k = min(delta_1(e_k), delta_2(e_k)) raised by their evaluation error bounds, at samples e_k (the
    finite pair's losses and a uniform grid of ``spacing`` from well below 0 up to where the Gaussian
    curve underflows), anchored at (0, 1): a convex piecewise-linear curve >= the largest convex
    minorant of min(delta_1, delta_2), which is >= the curve of any pair both dominate.  Its atoms
    sit at the hull's vertices (Q-mass = the slope increase, P-mass = gamma Q-mass), P(+inf) = w at
    the last sample; the P-total is made >= 1 exactly and the curve at the vertices verified >= w
    from the stored floats.  Pessimistic.  ArithmeticError if that verification fails."""
    from ..profiles.base import GaussianProfile
    from ..pld.discretize import LOG_DELTA_REL_ACCURACY

    losses = np.asarray(losses, dtype=float)
    p = np.asarray(p, dtype=float)
    order = np.argsort(losses)
    losses, p = losses[order], p[order]
    g = GaussianProfile(gauss_sigma)
    mu = g.r
    hi = 0.5 * mu * mu + MIN_TOP_Z * mu
    lo = -max(8.0, 0.5 * mu * mu + 10.0 * mu)
    grid = np.arange(math.floor(lo / spacing), math.ceil(hi / spacing) + 1) * spacing
    eps = np.unique(np.concatenate([grid, losses[(losses > grid[0]) & (losses < grid[-1])]]))
    d1, rel1 = _finite_delta_sorted(losses, p, p_inf, eps)
    d1 = d1 * (1.0 + rel1)
    d2 = np.asarray(g.delta(eps), dtype=float)
    with np.errstate(divide="ignore"):
        ld = np.where(d2 > 0, np.abs(np.log(np.where(d2 > 0, d2, 1.0))), 0.0)
    d2 = d2 * (1.0 + LOG_DELTA_REL_ACCURACY * (2.0 + ld)) + value_error(d2)
    w = np.minimum(d1, d2)
    gam = np.exp(eps)
    # targets raised by twice the verification's relative error bound, so that the stored pair's curve,
    # evaluated with its own rounding, still verifies above w (the slack grows until it does: the
    # check's error bound depends on the vertices)
    slack = 2.0 * _sum_rel(len(eps) + 1, len(eps), 2.0 * float(np.abs(eps).max()) + 100.0)
    for _ in range(3):
        prof = _hull_pair(eps, gam, w, slack)
        if prof is not None:
            return prof
        slack *= 4.0
    raise ArithmeticError("min_upper_profile: the hull's pair does not verify above the samples")


def _hull_pair(eps, gam, w, slack):
    """The finite pair of :func:`min_upper_profile` with targets w (1 + slack), or None if it does not
    verify above w at its atoms."""
    wt = np.minimum(w * (1.0 + slack), 1.0)
    # lower convex hull of (0, 1) and (gam_k, w_k) (monotone chain; slopes compared as products)
    xs = np.concatenate([[0.0], gam])
    ys = np.concatenate([[1.0], wt])
    X, Y = xs.tolist(), ys.tolist()
    hull = [0, 1]
    for k in range(2, len(X)):
        if not k & 0x3FFF:
            _deadline.check("the random-allocation hull")
        xk, yk = X[k], Y[k]
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (Y[b] - Y[a]) * (xk - X[b]) >= (yk - Y[b]) * (X[b] - X[a]):
                hull.pop()
            else:
                break
        hull.append(k)
    v = np.asarray(hull[1:]) - 1  # vertices (indices into eps); the anchor dropped
    gv, wv = gam[v], wt[v]
    slopes = np.diff(np.concatenate([[1.0], wv])) / np.diff(np.concatenate([[0.0], gv]))
    slopes = np.append(slopes, 0.0)
    qv = np.maximum(np.diff(slopes), 0.0)
    pv = gv * qv
    pinf = float(wv[-1])
    # the P-total >= 1 exactly (the PLD statement needs it): a deficit goes to an atom of loss 0
    lv = eps[v]
    deficit = -math.fsum(np.concatenate([pv, [pinf, -1.0]]))
    if deficit > 0:
        lv, pv = np.append(lv, 0.0), np.append(pv, 2.0 * deficit)
        order = np.argsort(lv, kind="stable")
        lv, pv = lv[order], pv[order]
    # verification: the stored pair's curve at its atoms (the vertices and 0, lowered by its error bound)
    # >= w there; it is linear in gamma between them (eps = 0 is a sample of the uniform grid)
    at = np.union1d(v, np.searchsorted(eps, 0.0)) if deficit > 0 else v
    chk, rel = _finite_delta_sorted(lv, pv, pinf, eps[at])
    if not np.all(chk * (1.0 - rel) >= w[at]):
        return None
    keep = pv > 0
    return SummedFiniteProfile(lv[keep], pv[keep], pinf)


#: (top tail, spacing) of the coarser lattices tried, in order, where the default ones
#: (:data:`TOP_TAILS` at :data:`SPACING`) do not fit (small sigma: the likelihood ratio's lognormal
#: tail is heavy, MATH 13.2 "Small sigma"); each is as certified, only looser: the top tail goes to
#: P(+inf) (a floor on delta, which the better-of-two pair of 13.5 removes in the tail) and the
#: spacing adds at most h^2/4 to each coordinate's variance
FALLBACK_LATTICES = ((1e-8, 0.05), (1e-8, 0.1), (1e-8, 0.2), (1e-8, 0.5))


def allocation_epoch_amplified(sigma, t: int) -> FiniteProfile:
    """The amplified epoch pair (remove direction) of :func:`allocation_epoch_pair` on the default
    lattice, else on the first of :data:`FALLBACK_LATTICES` that fits; raises
    :class:`LatticeTooLarge` when none does.  ``sigma``: a Gaussian noise multiplier, or an event
    (any noise with a remove pair, MATH 13.9)."""
    x = sigma if isinstance(sigma, E.BaseEvent) and not isinstance(sigma, E.GaussianEvent) else None
    if x is None:
        x = float(sigma.sigma if isinstance(sigma, E.GaussianEvent) else sigma)
    try:
        return allocation_epoch_pair(x, int(t)).profile
    except LatticeTooLarge:
        for top, spacing in FALLBACK_LATTICES:
            try:
                return allocation_epoch_pair(x, int(t), spacing, (top,)).profile
            except LatticeTooLarge:
                continue
        raise


@functools.lru_cache(maxsize=16)
def allocation_epoch_upper(sigma: float, t: int):
    """(remove, add): the per-epoch upper pairs of random allocation, each the
    :func:`min_upper_profile` of the amplified pair (:func:`allocation_epoch_pair`; add: its reverse)
    and the unamplified epoch pair (Gaussian at noise sigma, which dominates one epoch in both
    directions, MATH 13), so that neither is worse than the better of the two (MATH 13.5); where that
    construction does not verify (ArithmeticError), the amplified pair alone.  Raises
    :class:`LatticeTooLarge` as :func:`allocation_epoch_amplified`."""
    prof = allocation_epoch_amplified(float(sigma), int(t))
    try:
        rem = min_upper_profile(prof.losses, prof.p_masses, prof.p_inf, float(sigma))
        add = min_upper_profile(-prof.losses, prof.q_masses, prof.q_minus_inf, float(sigma))
    except ArithmeticError:
        return prof, prof.reversed()
    return rem, add


class UnamplifiedBounds:
    """Certified bounds of a composition of random-allocation / shuffle epochs and unsampled Gaussian
    steps without amplification (docs/MATH.md 13, 13.5): upper = the Gaussian pair at mu_up
    (every epoch dominated by the Gaussian pair at sigma), lower = the Gaussian pair at mu_lo (the
    epoch sums, a post-processing), both closed forms with their rounding folded in
    (:func:`pldlib.exact.gaussian_exact`).  The PLD accountant answers with the better of these and
    its per-epoch bounds on each side (upper: the smaller, lower: the larger)."""

    def __init__(self, mu_up: float, mu_lo: float, terms: int):
        from ..exact import GaussianPair

        # mu^2 is a sum of `terms` positive terms of a few roundings each, then a square root
        rel = (max(terms, 56) + 8) * 2 * _U
        self.mu_up, self.mu_lo = mu_up, mu_lo
        self._up, self._lo = GaussianPair(mu_up, rel), GaussianPair(mu_lo, rel)

    def delta_bounds(self, eps):
        return self._lo.delta_bounds(eps)[0], self._up.delta_bounds(eps)[1]

    def epsilon_bounds(self, deltas):
        return self._lo.epsilon_bounds(deltas)[0], self._up.epsilon_bounds(deltas)[1]


def unamplified_bounds(components, relation: str) -> "UnamplifiedBounds | None":
    """:class:`UnamplifiedBounds` of ``components`` [(step or event, count)] when every component is a
    random-allocation or shuffle step of Gaussian noise (example level, whole epochs) or an unsampled
    Gaussian, and at least one is sampled; None otherwise.  Per epoch of t steps at noise sigma, the
    record in k of them: mu_up^2 += k c^2 / sigma^2, mu_lo^2 += k^2 c^2 / (t sigma^2) (c = 2 under
    substitution, else 1)."""
    c2 = 4.0 if relation == "substitution" else 1.0
    up2 = lo2 = 0.0
    sampled = False
    terms = 0
    for s, k in components:
        ev = getattr(s, "event", s)
        if isinstance(ev, E.Sampled) and ev.q < 1.0:
            if ev.sampling not in ("random_allocation", "shuffle") or ev.group != 1 \
                    or not isinstance(ev.event, E.GaussianEvent):
                return None
            sel = ev.selections
            t = epoch_length(ev.q, sel)
            if k % t:
                return None
            sig = ev.event.sigma
            up2 += (k // t) * sel * c2 / sig ** 2
            lo2 += (k // t) * sel * sel * c2 / (t * sig ** 2)
            sampled = True
        else:
            if isinstance(ev, E.Sampled):
                ev = ev.event
            if not isinstance(ev, E.GaussianEvent):
                return None
            up2 += k * c2 / ev.sigma ** 2
            lo2 += k * c2 / ev.sigma ** 2
        terms += 1
    if not sampled or not (up2 > 0 and math.isfinite(up2)):
        return None
    return UnamplifiedBounds(math.sqrt(up2), math.sqrt(lo2), 4 * terms)


def with_unamplified(components, relation: str, upper_only: bool, kind: str, x, compute):
    """The PLD accountant's ``delta`` / ``epsilon`` bounds (``compute()`` -> (lower, upper) at ``x``)
    combined with :func:`unamplified_bounds` where those apply: upper = the smaller, lower = the larger
    (both are certified; lower untouched for an upper-only accountant).  Where ``compute`` refuses
    (:class:`~pldlib.PrecisionLimitError`), the unamplified bounds alone (docs/MATH.md 13.5)."""
    from .._validate import PrecisionLimitError

    alt = unamplified_bounds(components, relation) if components else None
    if alt is None:
        return compute()
    alo, aup = alt.delta_bounds(x) if kind == "delta" else alt.epsilon_bounds(x)
    alo = np.broadcast_to(np.asarray(alo, dtype=float), np.shape(x))
    aup = np.broadcast_to(np.asarray(aup, dtype=float), np.shape(x))
    try:
        lo, up = compute()
    except PrecisionLimitError:
        lo = np.full(np.shape(x), np.nan)
        up = lo.copy()
    up = np.fmin(up, aup)
    if not upper_only:
        lo = np.fmax(lo, alo)
    elif np.isnan(lo).any():
        lo = np.where(np.isnan(lo), 0.0 if kind == "delta" else -np.inf, lo)
    return lo, up
