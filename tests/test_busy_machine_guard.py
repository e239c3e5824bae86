"""The busy-machine guard (:mod:`marllm.utils.threads`) takes effect whichever of torch and marllm is imported first.

Each case runs in a fresh interpreter, as a program using the library would: libgomp is loaded once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

from marllm.utils.threads import SPIN_COUNT

# Whether this torch runs its CPU kernels on libgomp (the PyPI wheels for Linux do): the guard's subject.
_LOADS_LIBGOMP = (
    "import torch, sys\n"
    "print(any('libgomp' in line for line in open('/proc/self/maps')) if sys.platform.startswith('linux') else False)"
)


def run_python(code: str, **environ: str) -> str:
    """The last line ``code`` prints in a fresh interpreter whose environment has neither ``GOMP_SPINCOUNT`` nor
    ``OMP_WAIT_POLICY`` unless given here."""
    env = {key: value for key, value in os.environ.items() if key not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env | environ)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def libgomp() -> None:
    if run_python(_LOADS_LIBGOMP) != "True":
        pytest.skip("this torch does not load libgomp: the guard has no libgomp to set")


def loaded_spins(first: str, **environ: str) -> dict[str, object]:
    code = (
        f"{first}\n"
        "import json, os\n"
        "from marllm.utils.threads import loaded_spin_counts\n"
        "spins = {'environ': os.environ.get('GOMP_SPINCOUNT'), 'loaded': list(loaded_spin_counts().values())}\n"
        "print(json.dumps(spins))"
    )
    return json.loads(run_python(code, **environ))


def test_importing_marllm_after_torch_writes_the_spin_into_the_loaded_libgomp(libgomp):
    assert loaded_spins("import torch; import marllm") == {"environ": SPIN_COUNT, "loaded": [int(SPIN_COUNT)]}


def test_importing_marllm_before_torch_sets_the_environment_libgomp_reads_at_load(libgomp):
    # libgomp read 1000 at load, so no word holds its default: nothing was found, or written.
    assert loaded_spins("import marllm; import torch") == {"environ": SPIN_COUNT, "loaded": []}


@pytest.mark.parametrize(
    ("environ", "loaded"), [({"GOMP_SPINCOUNT": "300000"}, [300000]), ({"OMP_WAIT_POLICY": "ACTIVE"}, [])]
)
def test_a_users_own_setting_is_left_alone_with_torch_imported_first(libgomp, environ, loaded):
    spins = loaded_spins("import torch; import marllm", **environ)
    assert spins == {"environ": environ.get("GOMP_SPINCOUNT"), "loaded": loaded}


# Idle workers' CPU time over short parallel regions separated by sleeps: spinning through the sleep, or not.
_IDLE_WORKERS_CPU = """
import time
{first}
torch.set_num_threads(2)
x = torch.randn(256, 256)
x @ x  # the pool's threads started
thread, process = time.thread_time(), time.process_time()
for _ in range(40):
    x @ x
    time.sleep(0.005)
print((time.process_time() - process) - (time.thread_time() - thread))
"""


def test_idle_threads_stop_spinning_when_marllm_is_imported_after_torch(libgomp):
    """The behaviour, not the variable: with torch imported first and marllm after, torch's idle worker spends a
    fraction of the CPU time it spends without marllm while the main thread sleeps between parallel regions (about
    20 ms against 500 ms over 40 sleeps of 5 ms on a 2-core host). Spin time is CPU time whatever the load: a busy
    machine stretches it in wall time, not in CPU time."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: libgomp throttles its spin when it has more threads than cores")
    spinning = float(run_python(_IDLE_WORKERS_CPU.format(first="import torch")))
    guarded = float(run_python(_IDLE_WORKERS_CPU.format(first="import torch\nimport marllm")))
    assert guarded < spinning / 4, f"idle workers' CPU: {guarded:.3f} s with marllm, {spinning:.3f} s without"


def test_a_loaded_runtime_whose_spin_is_not_found_is_named_once(monkeypatch):
    """Another libgomp build (its variable not where this one keeps it): the guard cannot apply and says so, once."""
    from marllm.utils import threads

    monkeypatch.setenv("GOMP_SPINCOUNT", "x")  # recorded, so that the test's own setting is undone after it
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.setattr(threads, "_loaded_libgomps", lambda: {"/opt/other/libgomp.so.1": 0})
    monkeypatch.setattr(threads, "_find_spin_addresses", dict)
    monkeypatch.setattr(threads, "_already_warned", [])
    with pytest.warns(RuntimeWarning, match=r"/opt/other/libgomp.so.1.*GOMP_SPINCOUNT"):
        assert threads.wait_briefly_when_idle() is True
    monkeypatch.delenv("GOMP_SPINCOUNT")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        threads.wait_briefly_when_idle()  # said once per process
