"""What this machine runs MLX on: the MLX device, the BLAS in use and the CPU, for run records and
calibration keys (a calibration belongs to one device and BLAS)."""

from __future__ import annotations

import platform
import sys


def device() -> dict[str, str]:
    """e.g. {'mlx_device': 'Device(cpu, 0)', 'machine': 'x86_64', 'system': 'Linux', 'blas': 'mkl', 'cpu': ...}."""
    import mlx.core as mx

    info = {"mlx_device": str(mx.default_device()), "machine": platform.machine(), "system": platform.system()}
    try:
        from specpipe.engine.load.blas import blas_info

        blas = blas_info()
        info["blas"] = blas.name
        if blas.path:
            info["blas_path"] = blas.path
        if blas.threads:
            info["blas_threads"] = str(blas.threads)
        if blas.reduced:  # why fewer threads than cores: other processes were running at start
            info["blas_threads_reduced"] = blas.reduced
    except ImportError:
        pass
    if sys.platform == "linux":
        try:
            info["cpu"] = next(
                line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")
            )
        except (OSError, StopIteration):
            pass
    return info
