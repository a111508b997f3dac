"""pldlib.allocator: glibc malloc thresholds (a process-wide speed knob), checked by its effect.

The effect is measured, not assumed: a fresh process allocates, touches and frees two 1 MB
arrays 20 times and counts its minor page faults (getrusage).  Untuned, glibc's adaptive
thresholds serve them from the heap but trim the heap's top once 2 MB are free (twice the
largest block freed so far), so every round faults the pages in afresh (~470 faults, measured);
tuned, the freed pages stay and are reused.
"""
import os
import subprocess
import sys

import pytest

from pldlib import allocator

SCRIPT = """
import resource, numpy as np
import pldlib
a = np.ones(2**17); b = np.ones(2**17); del a, b  # (1 MB each: first use)
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    a = np.ones(2**17); b = np.ones(2**17)
    del a, b
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 20)
"""

glibc = pytest.mark.skipif(allocator._libc() is None, reason="the C library is not glibc: nothing to tune")


def _faults_per_round(tune: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "PLDLIB_TUNE_MALLOC"}
    if tune is not None:
        env["PLDLIB_TUNE_MALLOC"] = tune
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


@glibc
def test_tuning_at_import_stops_the_page_faults_of_large_temporaries():
    plain = _faults_per_round("0")
    tuned = _faults_per_round("1")
    assert plain > 200  # (2 MB = 512 pages of 4 KiB)
    assert tuned < 5


@glibc
def test_default_import_raises_the_adaptive_thresholds_only():
    """Unset, import pldlib frees one untouched block of just under 32 MiB: glibc's adaptive
    thresholds rise as after any large array, and the 1 MB arrays stop faulting; with
    PLDLIB_TUNE_MALLOC=0 nothing is done (the count above); and where the thresholds were set
    through glibc's own variables, they stay as set (the rounds fault again)."""
    assert _faults_per_round(None) < 5
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "PLDLIB_TUNE_MALLOC"}
    env["MALLOC_TRIM_THRESHOLD_"] = "65536"  # (as Dask's workers: adaptive thresholds off)
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    assert float(out.stdout.split()[-1]) > 200
    assert allocator.raise_adaptive_thresholds() is True


@glibc
def test_tune_allocator_reports_success_and_environ_names_both_thresholds():
    # (in a child process: the knob is process-wide, and this test process goes on to fork the
    # robustness harness's children under a memory cap)
    code = "from pldlib import allocator; print(allocator.tune_allocator() is True)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[-1] == "True"
    env = allocator.environ(1 << 20, 1 << 21)
    assert env == {"MALLOC_MMAP_THRESHOLD_": 1 << 20, "MALLOC_TRIM_THRESHOLD_": 1 << 21}


@pytest.mark.parametrize("bad", [-1, 1.5, "64M", True])
def test_bad_thresholds_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="mmap_threshold"):
        allocator.tune_allocator(mmap_threshold=bad)
    with pytest.raises(ValueError, match="trim_threshold"):
        allocator.environ(trim_threshold=bad)


def test_the_environment_switch(monkeypatch):
    monkeypatch.delenv("PLDLIB_TUNE_MALLOC", raising=False)
    assert allocator.enabled(True) is True and allocator.enabled(False) is False
    monkeypatch.setenv("PLDLIB_TUNE_MALLOC", "0")
    assert allocator.enabled(True) is False
    monkeypatch.setenv("PLDLIB_TUNE_MALLOC", "yes")
    with pytest.raises(ValueError, match="PLDLIB_TUNE_MALLOC: must be 0 or 1"):
        allocator.enabled(True)


def test_bad_switch_warns_at_import_and_fails_the_command():
    env = dict(os.environ, PLDLIB_TUNE_MALLOC="yes")
    imp = subprocess.run([sys.executable, "-W", "always", "-c", "import pldlib"], env=env, capture_output=True, text=True)
    assert imp.returncode == 0 and "PLDLIB_TUNE_MALLOC: must be 0 or 1" in imp.stderr
    cli = subprocess.run([sys.executable, "-m", "pldlib", "epsilon", "--sigma", "1", "--delta", "1e-5"], env=env,
                         capture_output=True, text=True)
    assert cli.returncode == 2 and "PLDLIB_TUNE_MALLOC" in cli.stderr


WORKER = """
import resource, numpy as np
from sweeps.methods import run_block, validate_options
spec = {"index": 0, "params": {"mechanism": "gaussian", "sigma": 1.0, "q": 0.01, "sampling": "poisson",
        "relation": "add_remove", "method": "pld"}, "steps": [10], "deltas": [1e-5],
        "options": validate_options("pld", "options.pld", {})}
out = run_block(spec)
assert not out["failed"].any(), out["error"]
a = np.ones(2**17); b = np.ones(2**17); del a, b
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    a = np.ones(2**17); b = np.ones(2**17)
    del a, b
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 20)
"""


@glibc
def test_sweep_blocks_tune_their_worker_under_dask_trim_threshold():
    """A sweep worker starts with Dask's MALLOC_TRIM_THRESHOLD_=65536 (every free goes back to the
    OS); its first block raises the thresholds in-process, unless PLDLIB_TUNE_MALLOC=0 there."""
    def faults(tune):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        env.update(MALLOC_TRIM_THRESHOLD_="65536", PLDLIB_TUNE_MALLOC=tune)
        out = subprocess.run([sys.executable, "-c", WORKER], env=env, capture_output=True, text=True, check=True)
        return float(out.stdout.split()[-1])

    assert faults("0") > 200
    assert faults("1") < 5


RELEASE = """
import numpy as np
from pldlib import allocator
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
assert allocator.tune_allocator()  # (heap-served blocks, 256 MB kept free before trimming)
blocks = [np.ones(2**20) for _ in range(16)]  # 16 x 8 MB from the heap, touched
del blocks
kept = rss()
ok = allocator.release_free_memory()
print(ok, kept, rss())
"""


@glibc
def test_release_free_memory_hands_the_kept_pages_back():
    """With the thresholds raised, freed memory stays with the process (the point of the knob);
    release_free_memory gives it back to the OS: the resident size falls by most of the 128 MB
    freed (in a child process: the knob is process-wide)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", RELEASE], env=env, capture_output=True, text=True, check=True)
    ok, kept, after = out.stdout.split()[-3:]
    assert ok == "True"
    assert int(kept) - int(after) > 100 * 2**20, (kept, after)
