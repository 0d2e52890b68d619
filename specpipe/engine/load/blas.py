"""Load an optimised BLAS into the process before MLX's Linux CPU backend binds its reference BLAS.

Call `preload_blas()` before the first `import mlx.core`: on Linux it dlopens, with RTLD_GLOBAL so
MLX's GEMM calls resolve to it (15-25x faster), the first of: a system OpenBLAS (Debian / Ubuntu /
Fedora paths), the OpenBLAS of the PyPI `scipy-openblas32` wheel (pip_openblas.py), the PyPI `mkl`
wheel. OpenBLAS comes first because its few-row GEMM is what a verify forward runs: T(17)/T(1) is
1.8 with it and 2.8 with MKL on the CPUs measured (docs/benchmarks.md). It never raises, never
imports mlx, does nothing on macOS, and is idempotent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import platform
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class BlasInfo:
    """Which BLAS MLX will use: name is "openblas", "mkl", "accelerate" or "reference"."""

    name: str
    path: str | None
    notice: str | None
    threads: int | None = None  # as the library reports it; None when unknown (reference, Accelerate)
    reduced: str | None = None  # why fewer threads than cores (other processes were running at load)


_HOW_TO_GET = (
    "install one for 15-25x faster CPU matmul: `pip install scipy-openblas32 lief` (`pip install -e .` brings them) "
    "or `apt-get install libopenblas0-pthread` (Debian/Ubuntu)"
)

_state: BlasInfo | None = None  # what this process loaded; kept so later calls report the same thing
_handles: list[ctypes.CDLL] = []  # keep the libraries referenced for the life of the process


def _openblas_candidates() -> list[str]:
    """Known OpenBLAS locations for this machine's architecture, most preferred first."""
    triplet = {
        "x86_64": "x86_64-linux-gnu",
        "amd64": "x86_64-linux-gnu",
        "aarch64": "aarch64-linux-gnu",
        "arm64": "aarch64-linux-gnu",
    }.get(platform.machine().lower())
    paths: list[str] = []
    if triplet:
        base = f"/usr/lib/{triplet}"
        # pthread before openmp: the openmp build fights MLX's own threads; serial is single-core.
        for flavour in ("openblas-pthread", "openblas-openmp", "openblas-serial"):
            paths += [f"{base}/{flavour}/libopenblas.so.0", f"{base}/{flavour}/libblas.so.3"]
        paths.append(f"{base}/libopenblas.so.0")
    paths += ["/usr/lib64/libopenblasp.so.0", "/usr/lib64/libopenblas.so.0", "/usr/lib/libopenblas.so.0"]
    found = ctypes.util.find_library("openblas")  # a soname, resolved by the loader's own search path
    if found:
        paths.append(found)
    return paths


def _mkl_candidates() -> list[str]:
    """`libmkl_rt` from the PyPI `mkl` wheel, which installs into <prefix>/lib."""
    paths: list[str] = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        paths += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")))
    return paths


def _openblas_coretype() -> str | None:
    """Kernel family OpenBLAS should use on this x86_64 CPU, judged from /proc/cpuinfo flags.

    OpenBLAS identifies CPUs by model number, so older releases (Debian 12 ships 0.3.21) fall
    back to "Prescott" (SSE3 kernels) on CPUs newer than themselves or behind a hypervisor's
    generic model, several times slower (docs/benchmarks.md). Only features the
    CPU reports are ever requested, so this can not select an unsupported (SIGILL) kernel.
    """
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return None
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def _mkl_threading_layer(path: str) -> str:
    """GNU (system libgomp) if present, else Intel OpenMP shipped next to MKL, else sequential.

    MKL loads its threading layer lazily at the first BLAS call and aborts the process if that
    layer's OpenMP runtime is missing, so pick one that exists. GNU first: Intel's runtime clashes
    with any libgomp user in the same process. Read by MKL at load time, so set it before.
    """
    if ctypes.util.find_library("gomp"):
        return "GNU"
    if glob.glob(os.path.join(os.path.dirname(os.path.abspath(path)), "libiomp5.so*")):
        return "INTEL"
    return "SEQUENTIAL"


LOADAVG = "/proc/loadavg"  # field 4 is "running/total": tasks on a CPU or ready for one at this instant
SAMPLES, SAMPLE_GAP_S = 5, 0.01  # a short probe: the fewest running over 40 ms, so a passing task is not load


def _cores() -> int:
    """Cores this process may run on (a container's or taskset's share, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _running_others() -> int | None:
    """Other tasks running now: the fewest of SAMPLES readings of /proc/loadavg's running count, less this
    process (the reader is always one of them). None where the file cannot be read (not Linux)."""
    import time

    counts = []
    for i in range(SAMPLES):
        try:
            with open(LOADAVG) as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            return None
        counts.append(running - _own_running())
        if i + 1 < SAMPLES:
            time.sleep(SAMPLE_GAP_S)
    return max(0, min(counts))


def _own_running() -> int:
    """This process's threads running now, at least 1 (the reader). A first run's check of its OpenBLAS copy
    (pip_openblas) leaves that library's workers spinning for a moment: they are ours, not another process."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return 1
    running = 0
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/stat") as f:
                running += f.read().rpartition(")")[2].split()[0] == "R"
        except (OSError, IndexError):
            continue
    return max(1, running)


def _openblas_threads(requested: int | None = None) -> tuple[int, str | None]:
    """Threads for OpenBLAS and, when fewer than the cores, why: the cores other processes hold now.

    OpenBLAS's pthread workers wait for each other at every GEMM; when another process holds a core, the
    worker scheduled out stalls the rest. On this 2-core VM with a load average of 8, two threads decoded
    SmolLM2 at 0.8-2.6 tok/s and one thread at 15-16 tok/s; on an idle machine both cores are faster
    (docs/benchmarks.md). Read by OpenBLAS at load time. The count is what runs at this instant
    (/proc/loadavg's running tasks, least of a 40 ms probe), not the one-minute load average: that still
    counts specpipe's own previous run for a minute after it ended, and gave the next run one thread.

    Args:
        requested: `blas.threads=` on the command line (None: choose).
    """
    cores = _cores()
    if requested is not None:
        return requested, None
    others = _running_others()
    if others is None:
        return cores, None
    threads = max(1, min(cores, cores - others))
    if threads == cores:
        return threads, None
    plural = "es" if others != 1 else ""
    return threads, f"{others} other process{plural} running on {cores} cores; blas.threads={cores} overrides"


def requested_threads(argv: list[str]) -> int | None:
    """`blas.threads=N` among command-line overrides (read before Hydra composes anything: OpenBLAS takes
    its thread count when it loads, before MLX is imported). None when absent or `null`.

    Raises:
        ValueError: N is not a whole number from 1 to 256 (the message says what to type).
    """
    value = None
    for arg in argv:
        key, sep, val = arg.lstrip("+").partition("=")
        if sep and key == "blas.threads":
            value = val.strip()
    if value is None or value.lower() in ("null", "none", ""):
        return None
    if not value.isdigit() or not 1 <= int(value) <= 256:
        raise ValueError(f"blas.threads={value}: use a whole number of threads from 1 to 256 (or null: chosen)")
    return int(value)


def _try_load(path: str, name: str, threads: int | None = None) -> BlasInfo | str:
    """dlopen `path` globally; return BlasInfo on success, else a one-line reason. `threads`: blas.threads."""
    chosen_threads = name == "openblas" and (
        threads is not None or not any(v in os.environ for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"))
    )
    why = None
    if chosen_threads:
        count, why = _openblas_threads(threads)
        os.environ["OPENBLAS_NUM_THREADS"] = str(count)
    if name == "mkl" and threads is not None:
        os.environ["MKL_NUM_THREADS"] = str(threads)
    if name == "openblas" and "OPENBLAS_CORETYPE" not in os.environ:
        # Read once by OpenBLAS's constructor at dlopen: must be in the environment before loading.
        core = _openblas_coretype()
        if core:
            os.environ["OPENBLAS_CORETYPE"] = core
    if name == "mkl" and "MKL_THREADING_LAYER" not in os.environ:
        os.environ["MKL_THREADING_LAYER"] = _mkl_threading_layer(path)
    if name == "mkl" and os.environ.get("MKL_THREADING_LAYER") == "GNU" and "OMP_WAIT_POLICY" not in os.environ:
        # MKL's GNU OpenMP threads spin between calls; when the machine has other work the spinning
        # threads starve the thread that feeds them (figures in docs/benchmarks.md). Passive threads sleep instead.
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    if os.sep in path and not os.path.exists(path):
        return f"{path} does not exist"
    try:
        lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        return f"could not load {path}: {str(exc).splitlines()[0]}"
    finally:
        if chosen_threads:
            # OpenBLAS has read it; a child process (a server, a test's run) judges its own moment.
            del os.environ["OPENBLAS_NUM_THREADS"]
    if not hasattr(lib, "cblas_sgemm"):
        # A BLAS without the C interface would load fine but MLX would keep calling its own.
        return f"{path} has no cblas_sgemm"
    _handles.append(lib)
    set_threads = getattr(lib, "openblas_set_num_threads", None)
    if chosen_threads and set_threads is not None:
        # the library may have been opened before (pip_openblas checks its copy multiplies right): its
        # constructor read the environment then, so say the count again
        set_threads(ctypes.c_int(count))
    get_threads = getattr(lib, "openblas_get_num_threads", None) or getattr(lib, "mkl_get_max_threads", None)
    return BlasInfo(name, path, None, int(get_threads()) if get_threads else None, why)


def _first(paths: list[str], name: str, threads: int | None = None) -> BlasInfo | None:
    for p in dict.fromkeys(paths):  # de-duplicate, keep order
        if os.sep in p and not os.path.exists(p):
            continue
        got = _try_load(p, name, threads)
        if isinstance(got, BlasInfo):
            return got
    return None


def _pip_openblas(threads: int | None = None) -> BlasInfo | None:
    """OpenBLAS from the `scipy-openblas32` wheel, through its plain-named copy (pip_openblas.py)."""
    from specpipe.engine.load.pip_openblas import unprefixed_library

    path = unprefixed_library()
    if isinstance(path, str):
        return None  # no wheel, no LIEF, or no writable cache: MKL is next
    got = _try_load(str(path), "openblas", threads)
    return got if isinstance(got, BlasInfo) else None


def _already_mapped() -> BlasInfo | None:
    """Detect an optimised BLAS loaded by someone else (LD_PRELOAD, numpy's bundled one is not it)."""
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if ".so" in line}
    except OSError:
        return None
    for lib in sorted(libs):
        base = os.path.basename(lib)
        if base.startswith("libmkl_rt"):
            return BlasInfo("mkl", lib, None)
        # numpy's wheel bundles libscipy_openblas64_ (ILP64 symbols with a suffix): MLX cannot use it.
        if base.startswith(("libopenblas", "libblas.so")) and "openblas" in lib and "scipy_openblas" not in lib:
            return BlasInfo("openblas", lib, None)
    return None


def _choose(prefer: str, threads: int | None = None) -> BlasInfo:
    if prefer == "auto":
        prefer = os.environ.get("SPECPIPE_BLAS", "").strip() or "auto"
    if prefer == "none":
        return BlasInfo("reference", None, None)
    if prefer not in ("auto", "openblas", "mkl"):
        # An explicit path: honour it or say why not; don't silently substitute another library.
        name = "mkl" if "mkl" in os.path.basename(prefer) else "openblas"
        got = _try_load(prefer, name, threads)
        if isinstance(got, BlasInfo):
            return got
        return BlasInfo("reference", None, f"BLAS {got}; using MLX's reference BLAS (slow)")
    if prefer in ("auto", "openblas"):
        found = _first(_openblas_candidates(), "openblas", threads) or _pip_openblas(threads)
        if found:
            return found
    if prefer in ("auto", "mkl"):
        found = _first(_mkl_candidates(), "mkl", threads)
        if found:
            return found
    what = "optimised BLAS" if prefer == "auto" else prefer
    return BlasInfo("reference", None, f"no {what} found, MLX uses its reference BLAS (slow); {_HOW_TO_GET}")


def preload_blas(prefer: str = "auto", threads: int | None = None) -> BlasInfo:
    """Load an optimised BLAS for MLX; call before the first `import mlx.core`.

    Args:
        prefer: "auto" (env SPECPIPE_BLAS, then OpenBLAS, then MKL), "openblas", "mkl",
            "none", or a path to a shared library. SPECPIPE_BLAS takes the same values.
        threads: `blas.threads=` (requested_threads); None: OPENBLAS_NUM_THREADS if set, else the
            cores other processes leave free now.

    Returns:
        The BLAS in use. `notice` is a one-line hint when the slow reference BLAS is used.
        Repeated calls return the first result; once mlx.core is imported nothing new is loaded.
    """
    global _state
    if _state is not None:
        return _state
    if sys.platform == "darwin":
        _state = BlasInfo("accelerate", None, None)  # MLX links Accelerate on macOS
    elif not sys.platform.startswith("linux"):
        _state = BlasInfo("reference", None, None)
    elif "mlx.core" in sys.modules:
        # Too late to swap: MLX has bound its BLAS symbols. Report what is mapped, if anything.
        _state = _already_mapped() or BlasInfo(
            "reference", None, "mlx.core was imported before preload_blas(); using MLX's reference BLAS (slow)"
        )
    else:
        _state = _already_mapped() or _choose(prefer, threads)
    return _state


def blas_phrase(info: BlasInfo) -> str:
    """Which BLAS a run uses, for a run's header line: "BLAS mkl", or the slow fallback and its fix.

    Callers print it as part of a line they print anyway (never a line of its own before the
    configuration is checked), so a bad-input error stays the only line on stderr.
    """
    if info.name != "reference" or not sys.platform.startswith("linux"):
        why = f": {info.reduced}" if info.reduced else ""
        threads = f" ({info.threads} thread{'s' if info.threads != 1 else ''}{why})" if info.threads else ""
        return f"BLAS {info.name}{threads}"
    fix = "`pip install scipy-openblas32 lief`"
    return f"BLAS reference (slow: {fix} for 15-25x faster CPU matmul)"


def blas_info() -> BlasInfo:
    """Return what `preload_blas` chose, or what is loaded now if it was never called (loads nothing)."""
    if _state is not None:
        return _state
    if sys.platform == "darwin":
        return BlasInfo("accelerate", None, None)
    return _already_mapped() or BlasInfo("reference", None, None)
