"""What a user sees while a model loads: the memory it will need against what the machine has, and progress.

Contract: `memory_notice(name, needed_bytes)` returns a one-line warning when the load will not fit in the
memory available now (MemAvailable on Linux), else "" (the loader prints it, on any stderr).
`LoadProgress(name, total, unit)` shows a bar over tensors (or files) on a terminal and nothing
elsewhere, so a redirected log stays one header line per run. `gguf_bytes_needed` prices a GGUF load from
its header alone: nothing here reads tensors or imports MLX.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Below this share of the available memory a load is said to fit: MLX's buffers, the KV cache and the
# tokenizer come on top of the weights, and the page cache is only partly reclaimable.
FITS_SHARE = 0.9
AUTO_FLOAT32_RAM_SHARE = 0.4  # quant=auto on CPU: float32 where it fits in this share of RAM (build.auto_precision)


def total_ram() -> int:
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def available_bytes() -> int | None:
    """Memory a new allocation can get without swapping (Linux MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def gguf_bytes_needed(path: Path, tensors: dict, precision: str, on_gpu: bool = False) -> int:
    """What loading `path` (its header's `tensors`) at `precision` will hold in memory: float32 (4 bytes a
    parameter) where the weights end as float32 (precision float32, auto on CPU, or a K-quant file
    dequantized), else the file's size.
    """
    from specpipe.engine.load.gguf import _MX_EXACT

    params = 0
    for t in tensors.values():
        n = 1
        for d in t.shape:
            n *= int(d)
        params += n
    dequantized = any(t.ggml_type not in _MX_EXACT for t in tensors.values())
    # quant=auto on CPU takes float32 only where it fits in 40% of RAM (build.auto_precision), else keeps the file's
    auto_float32 = precision == "auto" and not on_gpu and params * 4 < AUTO_FLOAT32_RAM_SHARE * total_ram()
    as_float32 = precision == "float32" or auto_float32 or dequantized
    return max(params * 4 if as_float32 else 0, path.stat().st_size)


def memory_notice(name: str, needed: int, available: int | None = None) -> str:
    """A warning when `needed` bytes will not fit in the memory available now, else ""."""
    available = available_bytes() if available is None else available
    if available is None or needed <= FITS_SHARE * available:
        return ""
    return (
        f"loading {name} needs about {needed / 2**30:.1f} GiB but this machine has {available / 2**30:.1f} GiB "
        "available: expect heavy swapping or an out-of-memory kill; free memory, or pick a smaller model "
        "or quant=stored (keeps the file's quantized weights)"
    )


def say(line: str) -> None:
    """A loader line on stderr, named by the command running; a closed stderr costs the load nothing."""
    from specpipe.run.run_folder import tool_name

    try:
        print(f"{tool_name() or 'specpipe'}: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


class LoadProgress:
    """A bar of `total` steps (tensors or files) on a terminal; silent off one. Use as a context manager."""

    def __init__(self, name: str, total: int, unit: str = "tensor", stream=None):
        stream = stream or sys.stderr
        self._bar = None
        if total > 1 and hasattr(stream, "isatty") and stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, unit=unit, desc=f"loading {name}", file=stream, leave=False, dynamic_ncols=True
            )

    def step(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def __enter__(self) -> LoadProgress:
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.close()
