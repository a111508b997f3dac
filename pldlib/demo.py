"""Demo: certified privacy accounting of DP-SGD-style training (``python -m pldlib.demo``).

The setting is the Gaussian mechanism with noise multiplier sigma = 1.0 and
Poisson subsampling at rate q = 0.01 (one training step = one subsampled
Gaussian release), composed over 1 to 10,000 steps.  If subsampling is not
available in this build of pldlib the demo falls back to q = 1 (full-batch
noisy gradient descent) and says so.

It prints a table of certified epsilon intervals (lower, upper, width) for
deltas 1e-5 .. 1e-10 and saves the privacy curve delta(eps) -- upper and lower
bounds, log-scale delta, for a few step counts -- to
``results/demo_privacy_curve.png``.

This module will later be replaced by a sweep run; it is kept on its own.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import pldlib

SIGMA = 1.0
Q = 0.01
STEPS = (1, 10, 100, 1_000, 10_000)
DELTAS = (1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10)
CURVE_STEPS = (10, 1_000, 10_000)
DEFAULT_PNG = Path("results") / "demo_privacy_curve.png"


def mechanism(q: float) -> pldlib.Gaussian:
    if q < 1.0:
        return pldlib.Gaussian(sigma=SIGMA, q=q, sampling="poisson")
    return pldlib.Gaussian(sigma=SIGMA)


def choose_q() -> tuple[float, str | None]:
    """q = 0.01 with Poisson sampling if this build supports it, else q = 1 (with the reason)."""
    try:
        mechanism(Q).branches()  # cheap: raises if this sampling scheme is not implemented
        return Q, None
    except Exception as e:  # NotImplementedError while subsampling is being written
        return 1.0, f"{type(e).__name__}: {e}"


def epsilon_table(q: float) -> tuple[list[str], dict]:
    """Rows of the table and the accountants (by step count) for the plot."""
    accs = {}
    lines = []
    head = f"{'steps':>7}  {'delta':>7}  {'eps lower':>12}  {'eps upper':>12}  {'width':>10}  {'rel.width':>9}"
    lines += [head, "-" * len(head)]
    for k in STEPS:
        t0 = time.perf_counter()
        acc = pldlib.account(mechanism(q), steps=k)
        iv = acc.epsilon(list(DELTAS))
        dt = time.perf_counter() - t0
        accs[k] = acc
        for j, (d, lo, up) in enumerate(zip(DELTAS, iv.lower, iv.upper)):
            w = up - lo
            rel = w / up if up > 0 else float("nan")
            lines.append(f"{k if j == 0 else '':>7}  {d:>7.0e}  {lo:>12.6f}  {up:>12.6f}  {w:>10.2e}  {rel:>9.1e}")
        lines.append(f"{'':>7}  (interval h = {acc.interval:.3g}, {dt:.2f} s)")
    return lines, accs


def plot_curves(accs: dict, q: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, axw) = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.3]})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    eps_max = 0.0
    for c, k in zip(colors, CURVE_STEPS):
        acc = accs.get(k) or pldlib.account(mechanism(q), steps=k)
        e_hi = float(acc.epsilon(1e-10).upper)
        eps_max = max(eps_max, e_hi)
        eps = np.linspace(0.0, 1.05 * e_hi, 160)
        iv = acc.delta(eps)
        ax.plot(eps, iv.upper, color=c, lw=1.8, label=f"{k:,} steps: upper (certified)")
        ax.plot(eps, np.maximum(iv.lower, 1e-300), color=c, lw=1.4, ls="--",
                label=f"{k:,} steps: lower")
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = (iv.upper - iv.lower) / iv.upper
        axw.plot(eps, rel, color=c, lw=1.4, label=f"{k:,} steps")
    ax.set_yscale("log")
    ax.set_ylim(1e-11, 1.0)
    ax.set_xlim(0, 1.05 * eps_max)
    ax.axhline(1e-5, color="0.6", lw=0.8, ls=":")
    ax.set_ylabel(r"$\delta(\varepsilon)$")
    samp = f"Poisson q = {q:g}" if q < 1 else "no subsampling (q = 1)"
    ax.set_title(f"Privacy curve, Gaussian sigma = {SIGMA:g}, {samp}\n"
                 "certified upper (solid) and lower (dashed) bounds")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, ncol=1, loc="upper right")
    axw.set_yscale("log")
    axw.set_xlabel(r"$\varepsilon$")
    axw.set_ylabel("(upper - lower) / upper")
    axw.grid(True, which="major", alpha=0.3)
    axw.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pldlib.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--png", type=Path, default=DEFAULT_PNG, help=f"plot path (default {DEFAULT_PNG})")
    ap.add_argument("--no-plot", action="store_true", help="skip the plot")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    q, why = choose_q()
    print(f"pldlib {pldlib.__version__} demo: DP-SGD-style accounting")
    if why is None:
        print(f"Gaussian mechanism, noise multiplier sigma = {SIGMA:g}, Poisson subsampling q = {q:g}, "
              "add/remove neighbours")
    else:
        print(f"Gaussian mechanism, noise multiplier sigma = {SIGMA:g}, NO subsampling (q = 1): "
              f"q = {Q:g} is not available here ({why})")
    print("Each row: certified interval lower <= eps(delta) <= upper.\n")
    lines, accs = epsilon_table(q)
    print("\n".join(lines))
    if not args.no_plot:
        plot_curves(accs, q, args.png)
        print(f"\nprivacy curve saved to {args.png}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
