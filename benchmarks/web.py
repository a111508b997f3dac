"""The calculator page in headless Chromium: time to the atlas answer and to the exact answer on
ten shapes, each checked against ``pldlib.calibrate``; screenshots of the DP-SGD headline and of
a bad input.  Writes results/WEB.md and results/web/*.png (``make screenshots``).

    python -m benchmarks.web
"""
from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import numpy as np

import pldlib
from pldlib.testing.chromium import Browser, find_chromium
from pldlib.web.app import BackgroundServer

OUT = Path("results")
SHOTS = OUT / "web"
#: (dataset size, batch size, epochs, delta, epsilon, sampling, relation)
SHAPES = [(60_000, 600, 100, 1e-5, 6.0, "poisson", "add_remove"), (60_000, 600, 10, 1e-5, 2.0, "poisson", "add_remove"),
          (50_000, 256, 30, 1e-5, 3.0, "poisson", "add_remove"), (50_000, 1024, 50, 1e-6, 4.0, "poisson", "add_remove"),
          (1_000_000, 4096, 5, 1e-7, 1.0, "poisson", "add_remove"), (60_000, 600, 20, 1e-5, 4.0, "wor", "add_remove"),
          (10_000, 100, 10, 1e-5, 8.0, "poisson", "add_remove"), (60_000, 600, 10, 1e-5, 2.0, "poisson", "remove"),
          (60_000, 600, 10, 1e-5, 2.0, "poisson", "substitution"), (100_000, 1000, 50, 1e-6, 2.0, "poisson", "add_remove")]


def _form(n, b, e, d, eps, sampling, relation):
    return {"dataset_size": str(n), "batch_size": str(b), "epochs": str(e), "q": "", "steps": "", "delta": str(d),
            "epsilon": str(eps), "sigma": "", "sampling": sampling, "relation": relation, "fprs": "0.001, 0.01, 0.1"}


def _run(b, url, form) -> tuple[float, float]:
    b.goto(url)
    for k, v in form.items():
        b.type(k, v)
    t0 = time.perf_counter()
    b.click("compute")
    b.wait_for("document.body.dataset.atlas === 'done' || document.body.dataset.exact === 'invalid'", timeout=60)
    t_atlas = time.perf_counter() - t0
    b.wait_for("['done', 'error'].includes(document.body.dataset.exact)", timeout=300)
    return t_atlas, time.perf_counter() - t0


def main() -> int:
    if find_chromium() is None:
        print("Chromium is not installed (apt-get install chromium)", file=sys.stderr)
        return 1
    SHOTS.mkdir(parents=True, exist_ok=True)
    rows = []
    with BackgroundServer() as srv, Browser() as b:
        _run(b, srv.url, _form(*SHAPES[0]))  # (warm-up: imports in the server, the page's first load)
        for shape in SHAPES:
            n, bs, ep, d, eps, sampling, relation = shape
            t_atlas, t_exact = _run(b, srv.url, _form(*shape))
            shown = float(b.js("document.getElementById('exact-sigma').dataset.value"))
            atlas = b.js("document.getElementById('atlas-sigma').dataset.value")
            q, steps = bs / n, int(np.ceil(ep / (bs / n) - 1e-9))
            ref = pldlib.calibrate(eps, d, q, steps, sampling=sampling, relation=relation)
            rows.append((shape, steps, t_atlas, t_exact, shown, float(atlas) if atlas else None, ref.sigma))
            if shape == SHAPES[0]:
                b.screenshot(SHOTS / "calculator_headline.png")
        b.goto(srv.url)
        for k, v in {**_form(*SHAPES[0]), "delta": "2"}.items():
            b.type(k, v)
        b.click("compute")
        b.wait_for("document.getElementById('error').textContent !== ''", timeout=30)
        b.screenshot(SHOTS / "calculator_bad_input.png")
        bad = b.js("document.getElementById('error').textContent")
    lines = ["# The calculator page in a browser", "",
             f"`python -m benchmarks.web` (`make screenshots`) on {platform.node() or 'this machine'}: `pldlib serve`'s page "
             "in headless Chromium, driven over the DevTools protocol. Seconds from the click on Compute to the "
             "atlas's certified sigma on the page, and to the accountant's exact answer (calibrated sigma, epsilon "
             "band over training, trade-off curve, TPR bounds) on the page. The page's sigma is compared with "
             "`pldlib.calibrate` called directly.", "",
             "| dataset | batch | epochs | steps | delta | target eps | sampling | relation | atlas s | exact s "
             "| atlas sigma | page sigma | calibrate sigma | same |", "|" + "---|" * 14]
    for (n, bs, ep, d, eps, sampling, relation), steps, ta, te, shown, atlas, ref in rows:
        lines.append(f"| {n:,} | {bs:,} | {ep} | {steps:,} | {d:g} | {eps:g} | {sampling} | {relation} | {ta:.2f} | "
                     f"{te:.2f} | {'-' if atlas is None else f'{atlas:.5g}'} | {shown:.6g} | {ref:.6g} | "
                     f"{'yes' if shown == ref else 'NO'} |")
    ta = [r[2] for r in rows]
    te = [r[3] for r in rows]
    lines += ["", f"Atlas answer: median {np.median(ta):.2f} s, worst {max(ta):.2f} s; exact answer: median "
                  f"{np.median(te):.2f} s, worst {max(te):.2f} s; page sigma equal to calibrate's on "
                  f"{sum(r[4] == r[6] for r in rows)} of {len(rows)} shapes.", "",
              f"Bad input (delta = 2) shows the command line's message: `{bad}`.", "",
              "![the DP-SGD headline](web/calculator_headline.png)", "", "![a bad input](web/calculator_bad_input.png)", ""]
    (OUT / "WEB.md").write_text("\n".join(lines))
    print("written: results/WEB.md, results/web/*.png")
    return 0 if all(r[4] == r[6] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
