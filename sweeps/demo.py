"""``python -m sweeps.demo``: run configs/demo.yaml into results/demo.zarr and summarise it.

Resumes when results/demo.zarr exists and was made from the same config
(only missing or failed blocks are computed; a store made from an edited
demo.yaml is started over), prints the status and a summary table, and
writes results/demo_sweep.png.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "demo.yaml"
STORE = ROOT / "results" / "demo.zarr"
PLOT = ROOT / "results" / "demo_sweep.png"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sweeps.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, help="worker processes (default: one per core)")
    ap.add_argument("--scheduler", help="existing Dask scheduler address")
    ap.add_argument("--restart", action="store_true", help="start results/demo.zarr over")
    args = ap.parse_args(argv)

    from .config import ConfigError, load_config
    from .execute import run_sweep
    from .report import plot_store, status_summary, status_text, summary_table
    from .store import StoreError, read_attrs

    t0 = time.monotonic()
    restart = args.restart
    try:
        attrs = read_attrs(str(STORE)) if STORE.exists() else None
        if attrs and attrs.get("sweeps_fingerprint") not in (None, load_config(CONFIG).fingerprint()):
            # the demo's own output, from an edited configs/demo.yaml: start it over
            print(f"{STORE} was made from another version of {CONFIG.name}: starting over")
            restart = True
        rep = run_sweep(CONFIG, store=str(STORE), workers=args.workers, scheduler=args.scheduler,
                        restart=restart)
    except (ConfigError, StoreError) as e:
        sys.stderr.write(f"sweeps demo: error: {e}\n")
        return 2
    print()
    print(status_text(status_summary(str(STORE)), max_errors=3))
    print()
    print(summary_table(str(STORE), delta=1e-6))
    out = plot_store(str(STORE), out=str(PLOT))
    print(f"plot: {out}")
    print(f"demo finished in {time.monotonic() - t0:.1f} s")
    if not rep.complete:
        print("some blocks have failed cells (see 'errors' above); running the demo again retries "
              "only those blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
