"""``sweeps`` command line: run / status / show / plot / report / demo.

Exit status: 0 success; 1 a run ended with failed (or lost) blocks; 2 bad
input or a store that cannot be used (one stderr line naming the problem;
nothing written); 130 interrupted by Ctrl-C (SIGINT); 143 terminated by
SIGTERM (128 + the signal number, as a shell reports a process the signal
killed, so batch systems see a termination).  After 130 and 143 the finished
blocks are in the store and ``sweeps run`` again resumes.

Sigma look-up tables are ordinary sweeps (an *atlas*: ``sweeps run
configs/atlas.yaml``, then ``python -m sweeps.atlas export``; :mod:`sweeps.atlas`).
"""
from __future__ import annotations

import argparse
import sys

from .preflight import DEFAULT_MAX_CELLS, DEFAULT_WORKER_TIMEOUT

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def _build() -> argparse.ArgumentParser:
    p = _Parser(prog="sweeps", description="Batch DP-accounting sweeps on Dask, stored in zarr.")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="run or resume a sweep from a YAML config")
    r.add_argument("config", help="YAML config file (see configs/demo.yaml; configs/atlas.yaml is the sweep "
                                  "behind the sigma look-up atlas)")
    r.add_argument("--scheduler", metavar="ADDR",
                   help="address of an existing Dask scheduler (default: DASK_SCHEDULER_ADDRESS / "
                        "Dask config, else an embedded LocalCluster)")
    r.add_argument("--workers", type=int, metavar="N",
                   help="worker processes of the embedded cluster (default: one per core)")
    r.add_argument("--store", metavar="PATH", help="store path or URL (default: the config's store)")
    r.add_argument("--restart", action="store_true",
                   help="discard an existing sweeps store (e.g. one made from another config, or one left "
                        "half-created by a driver that was killed) and start over; never removes anything "
                        "that is not a sweeps store")
    r.add_argument("--retries", type=int, default=2, metavar="N",
                   help="Dask retries of a block after a transient error (default 2)")
    r.add_argument("--task-seconds", type=float, default=None, metavar="S",
                   help="target seconds of one task of a sharded store (default: the config's "
                        "task_seconds, else 30); tasks are whole shards grouped by a cost model")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--quick", action="store_true",
                   help="run the config's quick: variant (smaller grid, its own store)")
    r.add_argument("--max-cells", type=int, default=None, metavar="N",
                   help=f"refuse a grid of more than N cells before allocating anything "
                        f"(default {DEFAULT_MAX_CELLS:.0e})")
    r.add_argument("--worker-timeout", type=float, default=DEFAULT_WORKER_TIMEOUT, metavar="S",
                   help="seconds to wait for workers before submitting, and without workers and progress "
                        f"while running, before giving up (default {DEFAULT_WORKER_TIMEOUT:.0f})")
    r.add_argument("--allow-mismatch", action="store_true",
                   help="run even when workers have other pldlib / sweeps code or library versions "
                        "than the driver (a warning instead of an error)")
    r.add_argument("--takeover", action="store_true",
                   help="take the store's lease from another driver that still looks alive")

    s = sub.add_parser("status", help="done / failed / missing counts of a store")
    s.add_argument("store")

    sh = sub.add_parser("show", help="tables of [eps_lower, eps_upper], steps x delta")
    sh.add_argument("store")
    sh.add_argument("--sel", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                    help="select values, e.g. --sel sigma=0.6 q=0.01 (numbers match within 1%%)")

    pl = sub.add_parser("plot", help="PNG of eps vs steps per delta (upper solid, lower dashed)")
    pl.add_argument("store")
    pl.add_argument("--sel", nargs="+", action="extend", default=[], metavar="KEY=VALUE")
    pl.add_argument("--out", metavar="PATH", help="PNG path (default results/<store name>.png)")

    rp = sub.add_parser("report", help="campaign report: markdown + PNG plots (accuracy, widths, "
                                       "seconds, failures, soundness) and the same as one HTML page")
    rp.add_argument("store")
    rp.add_argument("--out", metavar="DIR",
                    help="output folder (default results/campaigns/<store name>); REPORT.md and PNGs go there")
    rp.add_argument("--command", metavar="TEXT", default=None,
                    help="the command that reproduced the store, quoted in the report")

    d = sub.add_parser("demo", help="run configs/demo.yaml into results/demo.zarr and summarise it")
    d.add_argument("--workers", type=int, metavar="N")
    d.add_argument("--scheduler", metavar="ADDR")
    d.add_argument("--restart", action="store_true")
    return p


def _bad(msg: str) -> int:
    sys.stderr.write(f"sweeps: error: {msg}\n")
    return 2


class _OutError(Exception):
    pass


def _check_out_file(out) -> None:
    """--out must be a file we can write (checked before any work; one line, exit 2)."""
    if out is None:
        return
    import os
    from pathlib import Path

    p = Path(out).expanduser()
    if p.is_dir():
        raise _OutError(f"--out: {out!r} is a directory (give a .png file path)")
    parent = p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    target = p if p.exists() else parent
    if not parent.is_dir() or not os.access(target, os.W_OK) or (not p.exists() and not os.access(parent, os.X_OK)):
        raise _OutError(f"--out: cannot write {out!r} (permission denied or not a directory)")


def _creation_line(store: str) -> str | None:
    """``sweeps status`` of a store that is being created, or was left half-created."""
    from .lease import creator_state, describe_owner
    from .store import read_creating

    info = read_creating(store)
    if info is None:
        return None
    state = creator_state(store, info)
    what = "restarted" if info.get("action") == "restart" else "created"
    if state == "live":
        return f"{store}: being {what} by {describe_owner(info)}; no results yet"
    return (f"{store}: left half-created by a driver that is gone ({state.removeprefix('stale: ')}; it was "
            f"{describe_owner(info)}); it holds no results; sweeps run CONFIG --restart clears it and starts over")


def _stopped(e: BaseException) -> str:
    """What an interrupted ``sweeps run`` leaves behind (from ``run_sweep``'s note on ``e``)."""
    p = getattr(e, "sweeps_progress", None)
    if not p:
        return ""
    if p["state"] == "none":
        return " before the store was made; nothing was written"
    if p["state"] == "half":
        return f" while restarting {p['store']}: it is left half-created; run again with --restart"
    n = p["written"]
    return (f"; {n} block{'s' if n != 1 else ''} finished in this run {'are' if n != 1 else 'is'} saved in "
            f"{p['store']}; run again to resume")


def main(argv=None) -> int:
    args = _build().parse_args(argv)
    from .config import ConfigError
    from .execute import Terminated
    from .preflight import ClusterError
    from .report import SelectionError
    from .store import StoreError

    try:
        if args.cmd == "run":
            if args.workers is not None and args.workers < 1:
                return _bad("--workers: must be >= 1")
            if args.retries < 0:
                return _bad("--retries: must be >= 0")
            if args.max_cells is not None and args.max_cells < 1:
                return _bad("--max-cells: must be >= 1")
            if not args.worker_timeout > 0:
                return _bad("--worker-timeout: must be > 0")
            from .config import parse_config, read_config_data

            data = read_config_data(args.config)
            from .preflight import check_size, estimate_data

            # before the grid is expanded or anything allocated: counted from the YAML as written
            check_size(estimate_data(data, quick=args.quick), args.max_cells)
            cfg = parse_config(data, source=args.config, quick=args.quick)
            from .execute import run_sweep

            rep = run_sweep(cfg, store=args.store, scheduler=args.scheduler,
                            workers=args.workers, restart=args.restart, retries=args.retries,
                            progress=not args.no_progress, max_cells=args.max_cells,
                            worker_timeout=args.worker_timeout, allow_mismatch=args.allow_mismatch,
                            takeover=args.takeover, task_seconds=args.task_seconds)
            if rep.submitted:
                print(f"run {rep.run}: submitted {rep.submitted} blocks, {rep.ok} ok, {rep.failed} failed"
                      + (f", {rep.lost} lost" if rep.lost else "")
                      + f"; {rep.already_done} were done; store {rep.store}")
            else:
                print(f"nothing to do: all {rep.n_blocks} blocks of {rep.store} are done")
            return 0 if rep.complete else 1
        if args.cmd == "status":
            from .lease import mark_abandoned
            from .report import status_summary, status_text

            creating = _creation_line(args.store)
            if creating:
                print(creating)
                return 0
            print(status_text(mark_abandoned(args.store, status_summary(args.store))))
            return 0
        if args.cmd == "show":
            from .report import parse_sel, show_text

            print(show_text(args.store, parse_sel(args.sel)), end="")
            return 0
        if args.cmd == "plot":
            from .report import parse_sel, plot_store

            sel = parse_sel(args.sel)
            _check_out_file(args.out)
            try:
                out = plot_store(args.store, sel, args.out)
            except OSError as e:
                raise _OutError(f"--out: cannot write {args.out or 'the plot'!r}: {e.strerror or e}") from None
            print(f"wrote {out}")
            return 0
        if args.cmd == "report":
            from .campaign import write_report

            try:
                out = write_report(args.store, args.out, command=args.command)
            except OSError as e:
                raise _OutError(f"--out: cannot write {args.out or 'the report'!r}: {e.strerror or e}") from None
            print(f"wrote {out}")
            return 0
        if args.cmd == "demo":
            from .demo import main as demo_main

            argv2 = []
            if args.workers:
                argv2 += ["--workers", str(args.workers)]
            if args.scheduler:
                argv2 += ["--scheduler", args.scheduler]
            if args.restart:
                argv2 += ["--restart"]
            return demo_main(argv2)
    except (ConfigError, StoreError, SelectionError) as e:
        return _bad(str(e))
    except ClusterError as e:
        sys.stderr.write(f"sweeps: error: {e}\n")
        return e.exit_code
    except _OutError as e:
        return _bad(str(e))
    except Terminated as e:
        sys.stderr.write(f"sweeps: terminated (SIGTERM){_stopped(e)}\n")
        return 143
    except BrokenPipeError:  # e.g. `sweeps show ... | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as e:
        sys.stderr.write(f"sweeps: interrupted (Ctrl-C){_stopped(e)}\n")
        return 130
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
