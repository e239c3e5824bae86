"""How torch's worker threads wait: briefly, so that a busy machine does not make them spin against its other work.

torch's CPU kernels run on an OpenMP thread pool (GNU libgomp in the PyPI wheels for Linux). Between two parallel
regions each idle thread spins for ``GOMP_SPINCOUNT`` iterations (300,000 by default, about a millisecond) before it
sleeps. On a machine with as many threads as cores and nothing else to run that costs nothing; but when another
process shares the cores, the spinning threads burn the time slices that the thread doing work needs, and every
region waits for its slowest thread: on 2 cores beside one busy single-threaded process the shared CORY workload ran
3.2x slower than alone, against 1.5x with a spin of 1,000 (``benchmarks/bench_busy_machine.py``).

libgomp reads ``GOMP_SPINCOUNT`` once, when it is loaded, into an internal variable (``gomp_spin_count_var``) that
every idle thread reads each time it starts to wait. :func:`wait_briefly_when_idle` therefore does two things: it
sets the variable in the environment, for a libgomp not loaded yet (torch imported later, and every child process),
and, where torch has already loaded libgomp, it writes the spin into that variable of the loaded library
(:func:`shorten_loaded_spin`): the same setting, whichever of torch and marllm was imported first. libgomp does not
export the variable's symbol; it is found in the library's ``.bss`` as the one word holding libgomp's default spin
(300,000) with the throttled spin's default (100) two words on, both set by libgomp's start-up from an environment
without either variable. Where it is not found exactly once (another OpenMP runtime, another libgomp layout, a spin
already changed) nothing is written, and :func:`shorten_loaded_spin` says so.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
import warnings
from collections.abc import MutableMapping

__all__ = ["SPIN_COUNT", "loaded_spin_counts", "shorten_loaded_spin", "wait_briefly_when_idle"]

SPIN_COUNT = "1000"

_DEFAULT_SPIN = 300_000  # gomp_spin_count_var after start-up with neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY set
_DEFAULT_THROTTLED_SPIN = 100  # gomp_throttled_spin_count_var, likewise: the next variable but one (GCC's env.c)
_WORD = 8  # both are unsigned long long

_spin_addresses: dict[str, int] = {}  # each loaded libgomp's gomp_spin_count_var, once found


def wait_briefly_when_idle(environ: MutableMapping[str, str] | None = None) -> bool:
    """Make torch's idle threads spin :data:`SPIN_COUNT` iterations before they sleep, unless ``GOMP_SPINCOUNT`` or
    ``OMP_WAIT_POLICY`` is already set (a user's own choice wins); return whether it was set.

    Sets ``GOMP_SPINCOUNT`` in ``environ`` (the process's environment by default: a libgomp loaded later and child
    processes read it). For the process's own environment, a libgomp that torch has loaded already gets the spin
    written into it (:func:`shorten_loaded_spin`), so the order of ``import torch`` and ``import marllm`` does not
    matter. The ``marllm`` command and ``import marllm`` call it.
    """
    own = environ is None
    environ = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" in environ or "OMP_WAIT_POLICY" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    if own:
        loaded = _loaded_libgomps()
        written = shorten_loaded_spin(int(SPIN_COUNT))
        missed = [
            path for path in loaded if path not in written and path not in _spin_addresses and _may_serve_torch(path)
        ]
        if missed and not _already_warned:
            _already_warned.append(True)
            warnings.warn(
                f"marllm could not shorten the idle spin of the already loaded OpenMP runtime {missed}: its "
                "GOMP_SPINCOUNT variable was not found, so its idle threads keep spinning (300,000 iterations with "
                f"libgomp's default) until this process ends; set GOMP_SPINCOUNT={SPIN_COUNT} in the environment "
                "before Python starts, or import marllm before torch",
                RuntimeWarning,
                stacklevel=2,
            )
    return True


_already_warned: list[bool] = []  # the warning above is said once per process


def _may_serve_torch(path: str) -> bool:
    """False for a copy that another wheel bundles for its own code (auditwheel's ``<package>.libs/`` folder, e.g.
    pygame's): torch's kernels do not run on it, so its spin is not this guard's concern."""
    folder = os.path.basename(os.path.dirname(path))
    return not (folder.endswith(".libs") and not folder.startswith("torch"))


def shorten_loaded_spin(count: int) -> list[str]:
    """Write ``count`` into the spin count of every libgomp loaded in this process that still holds libgomp's default
    (read at load from an environment without ``GOMP_SPINCOUNT`` and ``OMP_WAIT_POLICY``); return the paths of the
    libraries written to. Idle threads use it from their next wait on, as if ``GOMP_SPINCOUNT`` had been set before
    the library was loaded. A library whose spin count is not found exactly once is left alone (not in the list)."""
    written = []
    for path, address in _find_spin_addresses().items():
        # An aligned word: one store, which the threads that read it see whole.
        ctypes.c_uint64.from_address(address).value = count
        _spin_addresses[path] = address
        written.append(path)
    return written


def loaded_spin_counts() -> dict[str, int]:
    """The spin count of each loaded libgomp whose variable has been found (see :func:`shorten_loaded_spin`), by
    path: what its idle threads spin before they sleep."""
    addresses = _spin_addresses | _find_spin_addresses()
    return {path: ctypes.c_uint64.from_address(address).value for path, address in addresses.items()}


def _find_spin_addresses() -> dict[str, int]:
    """Where each loaded libgomp that still holds the default spin keeps ``gomp_spin_count_var``: the one aligned word
    of its ``.bss`` that holds 300,000 with 100 two words on (a library with no such word, or several, is left out)."""
    found = {}
    for path, base in _loaded_libgomps().items():
        bss = _bss_section(path)
        if bss is None:
            continue
        start, size = base + bss[0], bss[1]
        start += -start % _WORD
        words = ctypes.string_at(start, size - size % _WORD)
        values = struct.unpack(f"={len(words) // _WORD}Q", words)
        hits = [
            i for i in range(len(values) - 2) if values[i] == _DEFAULT_SPIN and values[i + 2] == _DEFAULT_THROTTLED_SPIN
        ]
        if len(hits) == 1:
            found[path] = start + hits[0] * _WORD
    return found


def _loaded_libgomps() -> dict[str, int]:
    """Each libgomp mapped into this process (Linux's ``/proc/self/maps``), with its load address: where its mapping
    of file offset 0 starts. Empty on other systems."""
    if not sys.platform.startswith("linux"):
        return {}
    bases = {}
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and "libgomp" in os.path.basename(fields[5]) and int(fields[2], 16) == 0:
                    bases.setdefault(fields[5], int(fields[0].split("-")[0], 16))
    except OSError:
        return {}
    return bases


def _bss_section(path: str) -> tuple[int, int] | None:
    """The ``.bss`` section of a 64-bit little-endian ELF shared library, as (address relative to the load address,
    size); None if the file is not one or has none."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # ELFCLASS64, ELFDATA2LSB
        return None
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(index: int) -> tuple[int, int, int, int]:  # name offset, address, file offset, size
        name, _, _, address, offset, size = struct.unpack_from("<IIQQQQ", data, shoff + index * shentsize)
        return name, address, offset, size

    names_offset = section(shstrndx)[2]
    for index in range(shnum):
        name, address, _, size = section(index)
        end = data.index(b"\0", names_offset + name)
        if data[names_offset + name : end] == b".bss":
            return address, size
    return None
