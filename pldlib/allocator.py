"""glibc's malloc thresholds for NumPy temporaries: a process-wide speed knob.

A PLD composition makes many short-lived arrays of 0.1-10 MB, and pocketfft allocates
scratch space of the same size inside every transform.  glibc serves blocks above its mmap
threshold (128 KiB at start, raised as large blocks are freed) with fresh pages, and returns
freed memory at the top of its heap once more than its trim threshold is free: either way
the next array's pages are faulted in afresh, which can cost a large part of a PLD call's
time (measurements: ``results/BENCHMARKS.md``).  Dask's workers set MALLOC_TRIM_THRESHOLD_=65536, which returns every freed block at once.

:func:`tune_allocator` raises both thresholds for the current process (``mallopt``; glibc
only, a no-op elsewhere), :func:`environ` gives the same settings as environment variables
for child processes.  Freed memory up to the trim threshold then stays with the process
instead of going back to the OS; answers are unchanged.  The ``pldlib`` command and the
sweep workers (at their first block) apply it unless ``PLDLIB_TUNE_MALLOC=0``.

``import pldlib`` does less by default (``PLDLIB_TUNE_MALLOC`` unset): :func:`raise_adaptive_thresholds`
brings glibc's own adaptive thresholds to where any process that once freed a 32 MiB array has
them (blocks up to 32 MiB from the heap, up to 64 MiB of freed memory kept), by allocating and
freeing one such block, never touched.  glibc's policy stays adaptive and its limits are its
own; a fresh process that only runs PLD queries otherwise never frees a block that large, and
would fault the pages of its temporaries in on every call (the largest resident size grows by
a few MB instead).  ``=0`` turns it off,
``=1`` applies :func:`tune_allocator` at import instead.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "tune_allocator", "raise_adaptive_thresholds", "release_free_memory",
           "environ", "enabled"]

#: blocks up to this size come from the heap (glibc's adaptive threshold stops at 32 MiB)
MMAP_THRESHOLD = 64 * 2**20
#: freed memory kept at the top of the heap before it is returned to the OS
TRIM_THRESHOLD = 256 * 2**20

_M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
ENV = "PLDLIB_TUNE_MALLOC"


def _check(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: must be a non-negative integer number of bytes, got {value!r}")
    return value


@functools.lru_cache(maxsize=1)
def _libc():
    """glibc, loaded once; None elsewhere (other platforms, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # glibc only (musl has no mallopt thresholds)
        return libc
    except (OSError, AttributeError):
        return None


def tune_allocator(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> bool:
    """Set glibc's mmap and trim thresholds of this process (bytes).

    Returns True when both were set, False where the C library is not glibc (nothing
    changes there).  Raises ValueError for a negative or non-integer threshold.
    """
    mmap_threshold = _check("mmap_threshold", mmap_threshold)
    trim_threshold = _check("trim_threshold", trim_threshold)
    libc = _libc()
    if libc is None:
        return False
    ok = libc.mallopt(_M_MMAP_THRESHOLD, ctypes.c_int(min(mmap_threshold, 2**31 - 1))) == 1
    return ok and libc.mallopt(_M_TRIM_THRESHOLD, ctypes.c_int(min(trim_threshold, 2**31 - 1))) == 1


#: glibc's adaptive mmap threshold stops at this (DEFAULT_MMAP_THRESHOLD_MAX on 64-bit systems)
ADAPTIVE_MAX = 32 * 2**20


def raise_adaptive_thresholds() -> bool:
    """Allocate and free one block of just under :data:`ADAPTIVE_MAX` bytes (never touched, so
    no page is faulted in): glibc then raises its adaptive mmap threshold to the block's size
    and its trim threshold to twice that, as after any large array is freed.  Nothing changes
    where the thresholds were set explicitly (``mallopt``, ``MALLOC_*_`` variables): glibc
    adapts them no more.  False where the C library is not glibc or the block could not be had."""
    libc = _libc()
    if libc is None:
        return False
    malloc, free = libc.malloc, libc.free
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    p = malloc(ADAPTIVE_MAX - 2 * 4096)  # (with its header, at most ADAPTIVE_MAX once page-rounded)
    if not p:
        return False
    free(p)
    return True


def release_free_memory() -> bool:
    """Hand the free memory of every malloc arena back to the OS (glibc ``malloc_trim(0)``);
    False where the C library is not glibc (nothing happens there)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def environ(mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD) -> dict:
    """The same settings as glibc environment variables, for processes about to be started."""
    return {"MALLOC_MMAP_THRESHOLD_": _check("mmap_threshold", mmap_threshold),
            "MALLOC_TRIM_THRESHOLD_": _check("trim_threshold", trim_threshold)}


def enabled(default: bool) -> bool:
    """Whether ``PLDLIB_TUNE_MALLOC`` asks for the tuning ("1") or against it ("0"); ``default``
    when unset.  Any other value is an error."""
    v = os.environ.get(ENV, "").strip()
    if not v:
        return default
    if v not in ("0", "1"):
        raise ValueError(f"{ENV}: must be 0 or 1, got {v!r}")
    return v == "1"
