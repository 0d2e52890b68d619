"""BLAS preload: each case runs in a fresh interpreter, since loading must precede `import mlx.core`."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
from conftest import run_module

from specpipe.engine.load import blas

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="preloading only happens on Linux")

DEBIAN_OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0"

PRELOAD_AND_MATMUL = """
import json, sys
from specpipe.engine.load.blas import preload_blas, blas_info
info = preload_blas()
assert preload_blas("none") is info  # idempotent: the first choice sticks
import numpy as np
import mlx.core as mx
rng = np.random.default_rng(0)
a = rng.standard_normal((256, 192), dtype=np.float32)
b = rng.standard_normal((192, 128), dtype=np.float32)
c = np.array(mx.matmul(mx.array(a), mx.array(b)))
ref = a.astype(np.float64) @ b.astype(np.float64)
print(json.dumps({"info": info.__dict__, "after": blas_info().__dict__,
                  "maxdiff": float(np.abs(c - ref).max()), "scale": float(np.abs(ref).max())}))
"""


def _run(code: str, **env: str | None) -> dict:
    full = dict(os.environ)
    for k, v in env.items():
        if v is None:
            full.pop(k, None)
        else:
            full[k] = v
    proc = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_preload_then_matmul_matches_numpy():
    out = _run(PRELOAD_AND_MATMUL, SPECPIPE_BLAS=None)
    assert out["maxdiff"] <= 1e-5 * out["scale"] * 192**0.5
    assert out["after"] == out["info"]
    if os.path.exists(DEBIAN_OPENBLAS) and "OPENBLAS_CORETYPE" not in os.environ:
        assert out["info"]["name"] == "openblas" and out["info"]["notice"] is None
    elif platform.machine() in ("x86_64", "aarch64"):
        # `pip install -e .` brings scipy-openblas32 and LIEF: a fresh machine gets OpenBLAS (MKL's few-row
        # GEMM makes verification dearer), made from the wheel in the specpipe cache, never the reference BLAS.
        assert out["info"]["name"] == "openblas" and "libopenblas-pypi-" in out["info"]["path"], out["info"]
    elif out["info"]["name"] == "reference":
        assert "libopenblas0-pthread" in out["info"]["notice"]  # tells the user how to get a fast one


def test_none_gives_reference():
    out = _run(PRELOAD_AND_MATMUL, SPECPIPE_BLAS="none")
    assert out["info"] == {"name": "reference", "path": None, "notice": None, "threads": None, "reduced": None}
    assert out["maxdiff"] <= 1e-5 * out["scale"] * 192**0.5


@pytest.mark.parametrize("bogus", ["/nonexistent/libblas.so", "/etc/hostname"])
def test_bogus_path_is_a_notice_not_a_crash(bogus):
    if not os.path.exists(bogus) and bogus == "/etc/hostname":
        pytest.skip("no /etc/hostname")
    out = _run(PRELOAD_AND_MATMUL, SPECPIPE_BLAS=bogus)
    info = out["info"]
    assert info["name"] == "reference" and info["path"] is None
    assert bogus in info["notice"] and "\n" not in info["notice"]


def test_too_late_after_mlx_import():
    code = """
import json, mlx.core
from specpipe.engine.load.blas import preload_blas
print(json.dumps(preload_blas().__dict__))
"""
    info = _run(code, SPECPIPE_BLAS=None)
    assert info["name"] == "reference" and "imported before" in info["notice"]


def test_explicit_path(tmp_path):
    if not os.path.exists(DEBIAN_OPENBLAS):
        pytest.skip("Debian libopenblas0-pthread not installed")
    out = _run(PRELOAD_AND_MATMUL, SPECPIPE_BLAS=DEBIAN_OPENBLAS)
    assert {k: out["info"][k] for k in ("name", "path", "notice")} == {
        "name": "openblas",
        "path": DEBIAN_OPENBLAS,
        "notice": None,
    }


def test_coretype_is_a_known_value_and_user_setting_wins():
    assert blas._openblas_coretype() in (None, "SkylakeX", "Haswell")
    code = """
import json, os
from specpipe.engine.load.blas import preload_blas
preload_blas("openblas")
print(json.dumps({"core": os.environ.get("OPENBLAS_CORETYPE")}))
"""
    assert _run(code, SPECPIPE_BLAS=None, OPENBLAS_CORETYPE="Haswell")["core"] == "Haswell"


REPORT_ONLY = """
import json
from specpipe.engine.load.blas import blas_info
before = blas_info()
maps = open("/proc/self/maps").read()
print(json.dumps({"name": before.name, "mapped": "libmkl" in maps or "libopenblas" in maps}))
"""


def test_blas_info_loads_nothing():
    # In a fresh interpreter blas_info only reports: nothing is mapped, so it says "reference".
    out = _run(REPORT_ONLY, SPECPIPE_BLAS=None, LD_PRELOAD=None)
    assert out == {"name": "reference", "mapped": False}


def test_phrase_names_the_blas_and_the_fix():
    assert blas.blas_phrase(blas.BlasInfo("mkl", "/x/libmkl_rt.so.2", None)) == "BLAS mkl"
    assert blas.blas_phrase(blas.BlasInfo("openblas", "/x/libopenblas.so", None, 1)) == "BLAS openblas (1 thread)"
    slow = blas.blas_phrase(blas.BlasInfo("reference", None, "whatever"))
    assert slow.startswith("BLAS reference (slow:") and "install" in slow and "\n" not in slow


def test_a_notice_never_adds_a_line_to_an_error(tmp_path):
    # A BLAS that cannot load makes a notice; a bad override must still be the only line on stderr.
    env = dict(os.environ, SPECPIPE_BLAS=str(tmp_path / "libnope.so"))
    proc = run_module("specpipe.cli", ["model=tiny-random", "draft=bogus"], tmp_path, env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "draft=bogus" in proc.stderr
    ok = run_module("specpipe.cli", ["model=tiny-random", "max_tokens=2"], tmp_path, env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "BLAS reference (slow:" in ok.stderr.splitlines()[0]  # the run's header says it, once


def test_nothing_found_gives_install_hint(monkeypatch):
    # _choose is the search itself, without the once-per-process state: safe to call in-process
    # because with no candidates it loads nothing.
    monkeypatch.setattr(blas, "_openblas_candidates", lambda: [])
    monkeypatch.setattr(blas, "_mkl_candidates", lambda: [])
    monkeypatch.setattr(blas, "_pip_openblas", lambda threads=None: None)
    monkeypatch.delenv("SPECPIPE_BLAS", raising=False)
    info = blas._choose("auto")
    assert info.name == "reference" and info.path is None
    assert "apt-get install libopenblas0-pthread" in info.notice and "pip install scipy-openblas32 lief" in info.notice
    assert "no optimised BLAS found" in info.notice
    assert "\n" not in info.notice


WAIT_POLICY = """
import json, os
from specpipe.engine.load.blas import preload_blas
info = preload_blas()
env = os.environ
print(json.dumps({"name": info.name, "layer": env.get("MKL_THREADING_LAYER"), "wait": env.get("OMP_WAIT_POLICY")}))
"""


def test_mkl_gnu_threads_sleep_instead_of_spinning():
    # Spinning OpenMP threads starve the feeding thread on a busy machine (decode 1.5 vs 13+ tok/s).
    out = _run(WAIT_POLICY, SPECPIPE_BLAS="mkl", OMP_WAIT_POLICY=None, MKL_THREADING_LAYER="GNU")
    if out["name"] != "mkl":
        pytest.skip("no MKL in this environment")
    assert out["wait"] == "PASSIVE"
    kept = _run(WAIT_POLICY, SPECPIPE_BLAS="mkl", OMP_WAIT_POLICY="ACTIVE", MKL_THREADING_LAYER="GNU")
    assert kept["wait"] == "ACTIVE"  # a user's own choice is kept


PIP_OPENBLAS = """
import json
from specpipe.engine.load.blas import preload_blas
info = preload_blas("openblas")
import numpy as np
import mlx.core as mx
a = np.arange(12, dtype=np.float32).reshape(3, 4)
print(json.dumps({"info": info.__dict__, "ok": bool((np.array(mx.array(a) @ mx.array(a.T)) == a @ a.T).all())}))
"""


def test_pip_openblas_copy_is_made_once_and_used(tmp_path):
    from specpipe.engine.load import pip_openblas

    if pip_openblas.wheel_library() is None:
        pytest.skip("scipy-openblas32 not installed")
    cache = tmp_path / "cache"
    # System OpenBLAS paths are tried first; point the search at nothing else by naming the choice.
    first = _run(PIP_OPENBLAS, SPECPIPE_CACHE=str(cache), SPECPIPE_BLAS=None)
    made = sorted((cache / "blas").iterdir())
    if os.path.exists(DEBIAN_OPENBLAS):
        assert first["info"]["path"] == DEBIAN_OPENBLAS and made == []
        return
    assert [p.name for p in made] == [os.path.basename(first["info"]["path"])] and first["ok"]
    assert made[0].name.startswith("libopenblas-pypi-")  # no partial file is left beside it
    stamp = made[0].stat().st_mtime_ns
    again = _run(PIP_OPENBLAS, SPECPIPE_CACHE=str(cache), SPECPIPE_BLAS=None)
    assert again["info"]["path"] == first["info"]["path"]
    assert made[0].stat().st_mtime_ns == stamp  # reused, not rewritten


NO_LIEF = """
import json, sys
sys.modules["lief"] = None  # as if LIEF were not installed: `import lief` raises ImportError
from specpipe.engine.load.pip_openblas import unprefixed_library
from specpipe.engine.load.blas import _choose
print(json.dumps({"why": str(unprefixed_library()), "next": _choose("auto").name}))
"""


def test_without_lief_the_loader_moves_on(tmp_path):
    from specpipe.engine.load import pip_openblas

    if pip_openblas.wheel_library() is None:
        pytest.skip("scipy-openblas32 not installed")
    out = _run(NO_LIEF, SPECPIPE_CACHE=str(tmp_path), SPECPIPE_BLAS=None)
    assert "lief is not installed" in out["why"]
    assert out["next"] in ("openblas", "mkl")  # a system OpenBLAS or MKL, never a crash
    assert not any((tmp_path / "blas").glob("*.so"))


def test_a_read_only_cache_is_a_reason_not_a_crash(tmp_path):
    from specpipe.engine.load import pip_openblas

    if pip_openblas.wheel_library() is None:
        pytest.skip("scipy-openblas32 not installed")
    if os.geteuid() == 0:
        blocker = tmp_path / "file"  # root ignores permissions: a file where the folder should be blocks it
        blocker.write_text("")
        cache = blocker
    else:
        cache = tmp_path / "ro"
        cache.mkdir(mode=0o500)
    code = "from specpipe.engine.load.pip_openblas import unprefixed_library; print(repr(str(unprefixed_library())))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, SPECPIPE_CACHE=str(cache)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "could not make a plain-named copy" in proc.stdout and "\\n" not in proc.stdout


THREADS = """
import json, os
from specpipe.engine.load.blas import preload_blas
info = preload_blas("openblas")
print(json.dumps({"name": info.name, "threads": info.threads, "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


def test_openblas_threads_follow_the_idle_cores_and_a_users_setting_wins():
    # Two threads on a machine whose other core is busy stall at every GEMM (0.8-2.6 vs 15 tok/s).
    cores = blas._cores()
    assert 1 <= blas._openblas_threads()[0] <= cores
    out = _run(THREADS, SPECPIPE_BLAS=None, OPENBLAS_NUM_THREADS=None, OMP_NUM_THREADS=None)
    if out["name"] != "openblas":
        pytest.skip("no OpenBLAS in this environment")
    assert 1 <= out["threads"] <= cores
    assert out["env"] is None  # not left for child processes: each judges the load at its own start
    mine = _run(THREADS, SPECPIPE_BLAS=None, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS=None)
    assert mine["threads"] == 1 and mine["env"] == "1"


def _fake_loadavg(tmp_path, monkeypatch, line: str, cores: int = 2) -> None:
    path = tmp_path / "loadavg"
    path.write_text(line)
    monkeypatch.setattr(blas, "LOADAVG", str(path))
    monkeypatch.setattr(blas, "SAMPLE_GAP_S", 0.0)
    monkeypatch.setattr(blas, "_cores", lambda: cores)
    monkeypatch.setattr(blas, "_own_running", lambda: 1)  # the fake reading counts the reader alone as ours


def test_this_process_own_running_threads_are_not_other_processes(tmp_path, monkeypatch):
    """A first run checks its fresh OpenBLAS copy (pip_openblas) before the probe, and that library's workers
    still spin: 3 running tasks, all this process's, are no load (that run got one thread before)."""
    _fake_loadavg(tmp_path, monkeypatch, "0.02 0.10 0.05 3/180 4242\n")
    monkeypatch.setattr(blas, "_own_running", lambda: 3)
    assert blas._openblas_threads() == (2, None)


def test_two_runs_back_to_back_get_the_same_threads(tmp_path, monkeypatch):
    """The second of two runs started back to back saw the first in the one-minute load average (1.9 on
    this 2-core machine) and got one thread; what runs now (only the reader itself) gives both two."""
    _fake_loadavg(tmp_path, monkeypatch, "0.02 0.10 0.05 1/180 4242\n")
    first = blas._openblas_threads()
    _fake_loadavg(tmp_path, monkeypatch, "1.93 0.71 0.30 1/181 4301\n")  # the first run just ended
    assert blas._openblas_threads() == first == (2, None)


def test_a_busy_core_costs_a_thread_and_says_why(tmp_path, monkeypatch):
    _fake_loadavg(tmp_path, monkeypatch, "0.50 0.40 0.30 2/180 4242\n")  # the reader and one other
    threads, why = blas._openblas_threads()
    assert threads == 1 and why == "1 other process running on 2 cores; blas.threads=2 overrides"
    assert blas.blas_phrase(blas.BlasInfo("openblas", "/x.so", None, 1, why)) == f"BLAS openblas (1 thread: {why})"
    assert blas._openblas_threads(requested=2) == (2, None)  # blas.threads=2


def test_blas_threads_is_read_from_the_command_line():
    assert blas.requested_threads(["model=tiny-random", "blas.threads=3", "hi"]) == 3
    assert blas.requested_threads(["++blas.threads=null"]) is None and blas.requested_threads([]) is None
    with pytest.raises(ValueError, match="blas.threads=0: use a whole number"):
        blas.requested_threads(["blas.threads=0"])


def test_blas_threads_on_the_command_line_sets_openblas_threads(tmp_path):
    proc = run_module(
        "specpipe.cli.generate",
        ["model=tiny-random", "max_tokens=2", "blas.threads=1", "stream=false", "hi"],
        tmp_path,
        {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")},
    )
    assert proc.returncode == 0, proc.stderr
    if "BLAS openblas" not in proc.stderr:
        pytest.skip("no OpenBLAS in this environment")
    assert "BLAS openblas (1 thread)" in proc.stderr
    bad = run_module("specpipe.cli.generate", ["model=tiny-random", "blas.threads=two", "hi"], tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "blas.threads=two" in bad.stderr
