"""Banded matrix mechanisms (BandMF) under balls-in-bins batches: pldlib's certified interval beside
JAX Privacy's own Monte Carlo accounting, and the certified noise against cyclic Poisson batches.

JAX Privacy accounts BandMF with ``BallsInBinsSampling`` by Monte Carlo only
(``jax_privacy.experimental.monte_carlo``: privacy-loss samples of the release with the example
in a uniform bin, gradient 1 at each of its steps, the mean of (1 - e^(eps - L))_+ as delta).
pldlib certifies an interval (docs/MATH.md 13.10; ``pldlib.interop.jax_privacy.account_bandmf``).

Strategies: ``jax_privacy.matrix_factorization.toeplitz.optimize_banded_toeplitz(steps, bands)``
(JAX Privacy's BandMF coefficients, unit norm).  Section 1 (balls-in-bins) and 2 (b-min-sep): N
samples per direction (seeded), empirical Bernstein band at confidence 1 - BETA jointly over the
epsilons (and both directions for balls-in-bins, add_remove; b-min-sep: remove).  Section 3: the
smallest certified noise multiplier for a target eps at delta 1e-5 under cyclic Poisson with
cycle = bands and q = bands / b, balls-in-bins (b bins) and b-min-sep (min_sep = bands), the same
expected batch, and the interval the true noise of the last two is certified to lie in.

    python -m benchmarks.correlated_bib [--samples 200000]   -> sections of results/CORRELATED.md
"""
from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from pathlib import Path

import numpy as np

from benchmarks.jax_mc import BETA, EPS, compare, mc_delta
from benchmarks.report import replace_marked

#: (sigma, bins b, rounds, bands): steps = b * rounds
SHAPES = [(3.0, 10, 10, 2), (3.0, 10, 10, 5), (4.0, 20, 10, 4), (4.0, 20, 10, 10), (5.0, 25, 16, 5),
          (5.0, 25, 16, 25), (6.0, 50, 8, 10), (2.0, 8, 4, 4), (8.0, 100, 4, 20), (4.0, 16, 16, 8)]
#: b-min-sep: (sigma, steps, bands, min_sep, sampling_prob)
BMS_SHAPES = [(3.0, 200, 4, 8, 0.2), (2.0, 100, 2, 4, 0.3), (5.0, 400, 5, 10, 0.1), (4.0, 300, 8, 8, 0.15),
              (6.0, 500, 10, 20, 0.1), (3.0, 160, 1, 4, 0.25)]
#: (bins b, rounds, bands, target eps) for the noise comparison
SAVING = [(50, 10, 5, 2.0), (50, 10, 5, 8.0), (100, 10, 10, 2.0), (100, 10, 10, 8.0), (256, 16, 16, 2.0),
          (256, 16, 16, 8.0), (256, 16, 64, 2.0), (256, 16, 64, 8.0)]
START, END = "<!-- bib:start -->", "<!-- bib:end -->"
START2, END2 = "<!-- bibsaving:start -->", "<!-- bibsaving:end -->"
START3, END3 = "<!-- bms:start -->", "<!-- bms:end -->"


def coefs(steps: int, bands: int) -> np.ndarray:
    from jax_privacy.matrix_factorization import toeplitz

    if bands == 1:
        return np.array([1.0])
    return np.asarray(toeplitz.optimize_banded_toeplitz(steps, bands, max_optimizer_steps=100), dtype=float)


def ours(sigma, b, rounds, c):
    from jax_privacy import batch_selection as B

    from pldlib.interop.jax_privacy import account_bandmf

    t0 = time.perf_counter()
    acc = account_bandmf(B.BallsInBinsSampling(iterations=b * rounds, cycle_length=b), sigma, c)
    iv = acc.delta(np.array(EPS))
    e5 = acc.epsilon(1e-5)
    return iv, e5, time.perf_counter() - t0


def section_mc(n: int) -> tuple[list[str], dict]:
    rows, ok_all, n_rows, data = [], 0, 0, []
    for i, (sigma, b, rounds, bands) in enumerate(SHAPES):
        c = coefs(b * rounds, bands)
        (pos, neg), t_mc = mc_delta(sigma, b, rounds, n, seed=2000 + i, c_col=c)
        iv, e5, t_ours = ours(sigma, b, rounds, c)
        for j, e in enumerate(EPS):
            lo_mc, up_mc, est, lo, up, ok = compare(pos, neg, iv, j)
            ok_all += ok
            n_rows += 1
            rows.append(f"| {sigma} | {b} | {rounds} | {bands} | {e} | [{lo:.4g}, {up:.4g}] | {est:.4g} "
                        f"| [{lo_mc:.4g}, {up_mc:.4g}] | {'yes' if ok else '**no**'} | "
                        + (f"[{e5.lower:.3f}, {e5.upper:.3f}] | {t_ours:.2f} | {t_mc:.1f} |" if j == 0 else " | | |"))
        data.append({"sigma": sigma, "bins": b, "rounds": rounds, "bands": bands, "eps_1e-5": [e5.lower, e5.upper],
                     "seconds_pldlib": t_ours, "seconds_mc": t_mc})
        print("\n".join(rows[-len(EPS):]), flush=True)
    ratios = [d["eps_1e-5"][1] / d["eps_1e-5"][0] for d in data if d["bands"] > 1 and d["eps_1e-5"][0] > 0]
    worst = max(d["seconds_pldlib"] for d in data)
    text = [
        START,
        "## Banded strategies under balls-in-bins, beside JAX Privacy's Monte Carlo accounting",
        "",
        f"`python -m benchmarks.correlated_bib --samples {n}`. BandMF with JAX Privacy's optimized banded Toeplitz "
        "coefficients (`optimize_banded_toeplitz(steps, bands)`, unit norm) and `BallsInBinsSampling(iterations = "
        "b * rounds, cycle_length = b)`: each example's bin is drawn once for the run. JAX Privacy's own sampler and "
        f"privacy-loss function, N = {n:,} samples per direction, empirical Bernstein band at confidence "
        f"1 - {BETA:g} jointly over the epsilons and both directions; add_remove. pldlib: the certified interval "
        "of `pldlib.interop.jax_privacy.account_bandmf` (docs/MATH.md 13.10). Seconds: pldlib for the four "
        "deltas and eps(1e-5); Monte Carlo for both directions.",
        "",
        f"**{ok_all} of {n_rows} rows consistent** (the certified interval meets the Monte Carlo band). "
        f"Every pldlib answer took at most {worst:.1f} s.",
        "",
        "| sigma | bins b | rounds | bands | eps | pldlib delta [lower, upper] | Monte Carlo estimate "
        "| Monte Carlo band | consistent | pldlib eps(1e-5) | pldlib s | Monte Carlo s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Both ends are certified (upper: the adversary is told the bin's position within its run of bands "
        "bins, which leaves one epoch of random allocation over b / bands bins; lower: the largest of three "
        "post-processings of real data sets, usually a max test over b / bands matched filters). Neither is "
        "tight: with more than one band the upper end of eps(1e-5) is "
        + (f"{min(ratios):.1f} to {max(ratios):.1f} times the lower end on these shapes. " if ratios else "")
        + "With one band the interval is random allocation's own. b-min-sep batches: the next section.",
        END,
    ]
    return text, {"rows": data, "consistent": ok_all, "n": n_rows, "samples": n}


def mc_bms(sigma, steps, bands, ms, p, c, n, seed):
    """JAX Privacy's b-min-sep sampler and privacy loss (remove direction: its dominating pair's
    positive samples), [(delta_hat, half_width)] over EPS, and the seconds taken."""
    from jax_privacy import batch_selection as B
    from jax_privacy.experimental.monte_carlo import sample_generation as G

    strategy = B.BMinSepSampling(sampling_prob=p, iterations=steps, min_sep=ms)
    rng = np.random.default_rng(seed)
    log_term = math.log(2 * len(EPS) / BETA)
    t0 = time.perf_counter()
    losses = np.concatenate([np.atleast_1d(G.get_privacy_loss_sample(strategy, sigma, c, seed=rng,
                                                                     positive_sample=True,
                                                                     num_samples=min(CHUNK_BMS, n - i))[0])
                             for i in range(0, n, CHUNK_BMS)])
    per = []
    for e in EPS:
        x = -np.expm1(np.minimum(e - losses, 0.0))
        v = float(np.var(x, ddof=1))
        per.append((float(np.mean(x)), math.sqrt(2 * v * log_term / n) + 7 * log_term / (3 * (n - 1))))
    return per, time.perf_counter() - t0


CHUNK_BMS = 5_000


def section_bms(n: int) -> tuple[list[str], dict]:
    from jax_privacy import batch_selection as B

    from pldlib.interop.jax_privacy import account_bandmf

    rows, ok_all, n_rows, data = [], 0, 0, []
    for i, (sigma, steps, bands, ms, p) in enumerate(BMS_SHAPES):
        c = coefs(steps, bands)
        per, t_mc = mc_bms(sigma, steps, bands, ms, p, c, n, seed=3000 + i)
        t0 = time.perf_counter()
        acc = account_bandmf(B.BMinSepSampling(sampling_prob=p, iterations=steps, min_sep=ms), sigma, c,
                             relation="remove")
        iv = acc.delta(np.array(EPS))
        e5 = acc.epsilon(1e-5)
        t_ours = time.perf_counter() - t0
        for j, e in enumerate(EPS):
            est, half = per[j]
            lo, up = float(iv.lower[j]), float(iv.upper[j])
            ok = up >= est - half and lo <= est + half
            ok_all += ok
            n_rows += 1
            rows.append(f"| {sigma} | {steps} | {bands} | {ms} | {p} | {e} | [{lo:.4g}, {up:.4g}] | {est:.4g} "
                        f"| [{max(est - half, 0):.4g}, {est + half:.4g}] | {lo / est if est > 0 else float('nan'):.3f} "
                        f"| {'yes' if ok else '**no**'} | "
                        + (f"[{e5.lower:.3f}, {e5.upper:.3f}] | {t_ours:.2f} | {t_mc:.1f} |" if j == 0 else " | | |"))
        data.append({"sigma": sigma, "steps": steps, "bands": bands, "min_sep": ms, "p": p,
                     "eps_1e-5": [e5.lower, e5.upper], "seconds_pldlib": t_ours, "seconds_mc": t_mc,
                     "lower_over_mc": [float(iv.lower[j]) / per[j][0] if per[j][0] > 0 else None
                                       for j in range(len(EPS))]})
        print("\n".join(rows[-len(EPS):]), flush=True)
    ratios = [d["eps_1e-5"][1] / d["eps_1e-5"][0] for d in data if d["eps_1e-5"][0] > 0]
    text = [
        START3,
        "## Banded strategies under b-min-sep, beside JAX Privacy's Monte Carlo accounting",
        "",
        f"`python -m benchmarks.correlated_bib --samples {n}`. BandMF with JAX Privacy's optimized banded Toeplitz "
        "coefficients and `BMinSepSampling(sampling_prob p, iterations = steps, min_sep)` (warm start): an example "
        "that sat out the previous min_sep - 1 steps takes part with probability p. JAX Privacy's own sampler and "
        f"privacy loss, N = {n:,} samples, empirical Bernstein band at confidence 1 - {BETA:g} jointly over the "
        "epsilons; remove direction. pldlib: `pldlib.interop.jax_privacy.account_bandmf` (docs/MATH.md 13.11). "
        "lower / MC: pldlib's certified lower delta over the Monte Carlo estimate.",
        "",
        f"**{ok_all} of {n_rows} rows consistent** (the certified interval meets the Monte Carlo band).",
        "",
        "| sigma | steps | bands | min_sep | p | eps | pldlib delta [lower, upper] | Monte Carlo estimate "
        "| Monte Carlo band | lower / MC | consistent | pldlib eps(1e-5) | pldlib s | Monte Carlo s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "The lower end (one statistic of a real data set: the release summed against the strategy's columns, a "
        "mixture of Gaussians over the participation count) lies close to the Monte Carlo estimate; the upper end "
        "(the smaller of the unamplified Gaussian and Poisson steps at rate p with the noise divided by the "
        "strategy's norm) is "
        + (f"{min(ratios):.1f} to {max(ratios):.1f} times the lower end in eps(1e-5)." if ratios else "far above it."),
        END3,
    ]
    return text, {"rows": data, "consistent": ok_all, "n": n_rows, "samples": n}


def _sigma_bracket(make_upper, make_lower, target, lo=0.05, hi=200.0, tol=2e-3):
    """(certified sigma: upper eps <= target; a sigma whose lower eps still exceeds the target or None)."""
    def bis(pred, a, b):
        while b / a > 1 + tol:
            m = math.sqrt(a * b)
            if pred(m):
                b = m
            else:
                a = m
        return a, b

    _, up = bis(lambda s: make_upper(s) <= target, lo, hi)
    low, _ = bis(lambda s: not (make_lower(s) > target), lo, up)
    return up, (low if make_lower(low) > target else None)


def _sigma_bracket_of(interval_at, target):
    """:func:`_sigma_bracket` of a certified eps interval as a function of sigma (cached; a sigma
    too small for floating point counts as not meeting the target)."""
    cache = {}

    def iv(s):
        if s not in cache:
            try:
                cache[s] = interval_at(s)
            except (ArithmeticError, MemoryError):
                cache[s] = None
        return cache[s]

    return _sigma_bracket(lambda s: iv(s).upper if iv(s) else math.inf,
                          lambda s: iv(s).lower if iv(s) else math.inf, target)


def section_saving() -> tuple[list[str], list]:
    from pldlib.correlated import (BandedStrategy, account_bandmf, b_min_sep_bandmf, balls_in_bins_bandmf,
                                   calibrate_bandmf)

    rows, data = [], []
    for b, rounds, bands, target in SAVING:
        steps = b * rounds
        c = coefs(steps, bands)
        st = BandedStrategy.toeplitz(c, steps)
        t0 = time.perf_counter()
        up, low = _sigma_bracket_of(lambda s: balls_in_bins_bandmf(s, st, b).epsilon(1e-5), target)
        t_bib = time.perf_counter() - t0
        t0 = time.perf_counter()
        q = bands / b
        p_bms = q / (bands - (bands - 1) * q)  # (the same expected batch: p / (1 + (bands - 1) p) = q / bands)
        bup, blow = _sigma_bracket_of(lambda s: b_min_sep_bandmf(s, st, p_bms, bands).epsilon(1e-5), target)
        t_bms = time.perf_counter() - t0
        t0 = time.perf_counter()
        cp = calibrate_bandmf(target, 1e-5, st, q=q, tol=2e-3)
        t_cp = time.perf_counter() - t0
        cp_lo = account_bandmf(cp, st, q=q).epsilon(1e-5)
        sav_up = 1 - up / cp
        sav_hi = (1 - low / cp) if low is not None else 1.0
        bsav_up = 1 - bup / cp
        bsav_hi = (1 - blow / cp) if blow is not None else 1.0
        rows.append(f"| {b} | {rounds} | {steps:,} | {bands} | {target:g} | {cp:.4f} (eps [{cp_lo.lower:.4f}, "
                    f"{cp_lo.upper:.4f}]) | {up:.4f} ({'%.4f' % low if low is not None else 'none'}) "
                    f"| [{sav_up:+.1%}, {sav_hi:+.1%}] | {p_bms:.4g} | {bup:.4f} "
                    f"({'%.4f' % blow if blow is not None else 'none'}) | [{bsav_up:+.1%}, {bsav_hi:+.1%}] "
                    f"| {t_cp:.1f} / {t_bib:.0f} / {t_bms:.0f} |")
        data.append({"bins": b, "rounds": rounds, "bands": bands, "target": target, "sigma_bib_certified": up,
                     "sigma_bib_below": low, "sigma_cyclic_poisson": cp, "p_b_min_sep": p_bms,
                     "sigma_bms_certified": bup, "sigma_bms_below": blow, "seconds_bib": t_bib, "seconds_cp": t_cp,
                     "seconds_bms": t_bms})
        print(rows[-1], flush=True)
    text = [
        START2,
        "## BandMF: balls-in-bins against cyclic Poisson batches, certified noise multipliers",
        "",
        "`python -m benchmarks.correlated_bib`. The same BandMF strategies (JAX Privacy's optimized banded "
        "Toeplitz coefficients) over b * rounds steps, three batch selections with the same expected batch "
        "(a fraction 1 / b of the data): cyclic Poisson with cycle = bands and q = bands / b (each example "
        "eligible every bands steps), balls-in-bins with b bins, and b-min-sep with min_sep = bands and p as "
        "shown; add_remove, delta = 1e-5. Cyclic Poisson: `calibrate_bandmf` (exact reduction, so its sigma is "
        "the true one within the tolerance). Balls-in-bins and b-min-sep: the smallest noise multiplier whose "
        "certified upper eps meets the target, and in brackets one whose certified lower eps still exceeds it "
        "(the true minimum lies between). Saving: 1 - sigma / sigma_cyclic_Poisson; the true saving lies in "
        "the interval shown (its left end is the saving one can certify today). Seconds per calibration.",
        "",
        "| bins b | rounds | steps | bands | target eps | cyclic Poisson sigma | balls-in-bins sigma "
        "| balls-in-bins: true saving in | b-min-sep p | b-min-sep sigma | b-min-sep: true saving in "
        "| seconds (cyclic / bib / b-min-sep) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "A negative saving means the scheme needs more noise than cyclic Poisson. The intervals are wide "
        "because balls-in-bins and b-min-sep are certified loosely (neither upper end amplifies over all the "
        "bins or steps): their left ends bound what can be claimed with a certificate today, not what the "
        "batches achieve. Where a whole interval is negative, the scheme needs more noise than cyclic Poisson "
        "whatever its true accounting.",
        END2,
    ]
    return text, data


START4, END4 = "<!-- bibplot:start -->", "<!-- bibplot:end -->"
PLOT = Path("results/correlated_bib.png")


def _section_rows(text: str, start: str, end: str, n_key: int) -> list[tuple]:
    """(key cells, eps, [lower, upper] delta, Monte Carlo estimate) of a section's table rows."""
    body = text[text.index(start):text.index(end)]
    out = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < n_key + 3 or not cells[0][:1].isdigit():
            continue
        lo, up = (float(x) for x in cells[n_key + 1].strip("[]").split(","))
        out.append((tuple(cells[:n_key]), float(cells[n_key]), lo, up, float(cells[n_key + 2])))
    return out


def plot(md: Path, js: Path) -> str:
    """results/correlated_bib.png from the report's own tables and JSON: (1) certified delta
    intervals against JAX Privacy's Monte Carlo estimates; (2) the noise multipliers of the three
    batch selections at equal batch size (certified, and the interval the true one lies in)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = md.read_text()
    d = json.loads(js.read_text())
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    ax = axes[0]
    for rows, color, label in ((_section_rows(text, START, END, 4), "tab:blue", "balls-in-bins"),
                               (_section_rows(text, START3, END3, 5), "tab:orange", "b-min-sep")):
        rows = [r for r in rows if r[4] > 0 and r[2] > 0]
        x = np.array([r[4] for r in rows])
        lo = np.array([r[2] for r in rows])
        up = np.array([r[3] for r in rows])
        ax.vlines(x, lo, up, color=color, alpha=0.6, label=f"{label}: certified [lower, upper]")
        ax.plot(x, x, ".", color=color, ms=3)
    lim = [1e-9, 1.0]
    ax.plot(lim, lim, "k--", lw=0.7, label="= Monte Carlo estimate")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1e-7, 1)
    ax.set_ylim(1e-9, 1)
    ax.set_xlabel("JAX Privacy Monte Carlo estimate of delta(eps)")
    ax.set_ylabel("pldlib certified delta(eps)")
    ax.set_title("BandMF: certified intervals against the Monte Carlo estimate", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    rows = d.get("saving", [])
    for j, r in enumerate(rows):
        ax.plot(j, r["sigma_cyclic_poisson"], "ks", ms=5, label="cyclic Poisson (exact)" if j == 0 else None)
        for off, key, color, name in ((-0.15, "bib", "tab:blue", "balls-in-bins"),
                                      (0.15, "bms", "tab:orange", "b-min-sep")):
            up, low = r[f"sigma_{key}_certified"], r[f"sigma_{key}_below"]
            ax.plot(j + off, up, "v", color=color, label=f"{name}: certified sigma" if j == 0 else None)
            if low is not None:
                ax.vlines(j + off, low, up, color=color, alpha=0.6,
                          label=f"{name}: the true sigma lies here" if j == 0 else None)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels([f"b{r['bins']} x{r['rounds']}\n{r['bands']} bands\neps {r['target']:g}" for r in rows],
                       fontsize=7)
    ax.set_ylabel("noise multiplier for eps at delta = 1e-5")
    ax.set_title("equal expected batch: noise each batch selection needs", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    PLOT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOT, dpi=110)
    plt.close(fig)
    return str(PLOT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--out", default="results/CORRELATED.md")
    ap.add_argument("--only", choices=["mc", "bms", "saving", "plot"], default=None)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    path = Path(args.out)
    js = Path("results/correlated/balls_in_bins.json")
    js.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(js.read_text()) if js.exists() else {}
    if args.only == "plot":
        args.only = "none"  # (only the plot below)
    if args.only in (None, "mc"):
        text, d = section_mc(args.samples)
        replace_marked(path, START, END, "\n".join(text))
        old["monte_carlo"] = d
        js.write_text(json.dumps(old, indent=1))
    if args.only in (None, "bms"):
        text, d = section_bms(args.samples)
        replace_marked(path, START3, END3, "\n".join(text))
        old["b_min_sep"] = d
        js.write_text(json.dumps(old, indent=1))
    if args.only in (None, "saving"):
        text, d = section_saving()
        replace_marked(path, START2, END2, "\n".join(text))
        old["saving"] = d
        js.write_text(json.dumps(old, indent=1))
    if js.exists() and START in path.read_text() and START3 in path.read_text():
        out = plot(path, js)
        replace_marked(path, START4, END4, "\n".join([
            START4, "## Plot: banded strategies under balls-in-bins and b-min-sep", "",
            f"![BandMF under balls-in-bins and b-min-sep]({Path(out).name})", "",
            "Left: every (shape, eps) row of the two Monte Carlo sections with a positive estimate; each certified "
            "interval should cross the dashed line (it meets the Monte Carlo band in every row). Right: the noise "
            "section's sigmas. dp_accounting has no event for these batch selections, so it has no value here.",
            END4]))
    print(f"wrote {path} and {js}")


if __name__ == "__main__":
    main()
