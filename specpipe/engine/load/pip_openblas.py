"""OpenBLAS from PyPI for MLX: a copy of `scipy-openblas32` whose symbols carry their plain names.

MLX's Linux CPU wheel calls `cblas_sgemm` (and a few LAPACK routines) by name, so an optimised BLAS
helps only if it exports those names. Debian's OpenBLAS does, but a fresh machine has none; MKL from
PyPI does, but its small-M GEMM is slow on this class of CPU (T(17)/T(1) = 2.8 against OpenBLAS's
1.8, docs/benchmarks.md), and that ratio decides whether speculation pays. `scipy-openblas32` (the
OpenBLAS numpy and SciPy ship, no Fortran runtime needed) exports every symbol with a `scipy_` prefix
so it can never clash with another BLAS. `unprefixed_library()` writes, once per wheel version, a
copy with the prefix dropped from its dynamic symbols (LIEF rebuilds the symbol hash tables) under
the specpipe cache, and returns its path; the loader then treats it like any OpenBLAS.

Never raises: any missing piece (wheel, LIEF, a read-only cache) returns None with a reason, and the
loader moves on to MKL.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import tempfile
from pathlib import Path

PACKAGE = "scipy_openblas32"
PREFIX = "scipy_"


def _cache_root() -> Path:
    # The same rule as model_store.cache_dir(), kept here so the loader imports nothing heavy.
    if os.environ.get("SPECPIPE_CACHE"):
        return Path(os.environ["SPECPIPE_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "specpipe"
    return Path.home() / ".cache" / "specpipe"


def wheel_library() -> Path | None:
    """The prefixed library inside the installed wheel, found without importing the package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder, "lib").glob("libscipy_openblas*.so*"))
        if found:
            return found[0]
    return None


def _rename_symbols(src: Path, dst: Path) -> None:
    import lief  # only on the first run per wheel version: it is a 12 MB extension

    binary = lief.ELF.parse(str(src))
    if binary is None:
        raise OSError(f"LIEF could not parse {src}")
    for symbol in binary.dynamic_symbols:
        name = str(symbol.name)
        if symbol.exported and name.startswith(PREFIX):
            symbol.name = name[len(PREFIX) :]
    binary.write(str(dst))


def _multiplies_correctly(path: Path) -> bool:
    """A 2x2 `cblas_sgemm` through the copy: a patch that loads but computes nonsense is never used."""
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    floats = ctypes.c_float * 4
    a, b, c = floats(1, 2, 3, 4), floats(5, 6, 7, 8), floats(0, 0, 0, 0)
    row_major, no_trans = 101, 111
    lib.cblas_sgemm.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, floats, ctypes.c_int, floats, ctypes.c_int]
    lib.cblas_sgemm.argtypes += [ctypes.c_float, floats, ctypes.c_int]
    lib.cblas_sgemm(row_major, no_trans, no_trans, 2, 2, 2, 1.0, a, 2, b, 2, 0.0, c, 2)
    return list(c) == [19.0, 22.0, 43.0, 50.0]


def unprefixed_library() -> Path | str:
    """Path of the plain-named copy (made on first use), or a one-line reason why there is none."""
    src = wheel_library()
    if src is None:
        return f"{PACKAGE} is not installed"
    version = importlib.metadata.version(PACKAGE.replace("_", "-"))
    dst = _cache_root() / "blas" / f"libopenblas-pypi-{version}-{src.stat().st_size}.so"
    if dst.exists():
        return dst
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        # Written beside its final name and renamed: two first runs at once never load half a file.
        fd, tmp = tempfile.mkstemp(prefix=".partial-", suffix=".so", dir=dst.parent)
        os.close(fd)
        try:
            _rename_symbols(src, Path(tmp))
            if not _multiplies_correctly(Path(tmp)):
                return f"the renamed copy of {src.name} multiplied wrongly; not used"
            os.chmod(tmp, 0o644)  # mkstemp makes it private; the cache is the user's, like the models beside it
            os.replace(tmp, dst)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except ImportError:
        return "lief is not installed (it renames scipy-openblas32's symbols)"
    except Exception as exc:  # any failure here only means "no pip OpenBLAS": the loader tries MKL next
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"could not make a plain-named copy of {src.name}: {why}"
    return dst
