"""`run(cfg) -> RunResult`: the real entry point, callable without Hydra's CLI.

Loads the models, instantiates the plug-ins named by the config, streams the
pipeline's events into `events.jsonl` (and the terminal), and writes
`summary.json` into the run folder. Raises SpecpipeError for bad input.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Callable

import msgspec
from omegaconf import DictConfig, OmegaConf

from specpipe.events import Event, EventWriter, ModelInfo, RunFinished, RunStats
from specpipe.metrics import StatsCollector


class RunResult(msgspec.Struct, kw_only=True):
    text: str
    tokens: list[int]
    stop_reason: str
    stats: RunStats
    target: ModelInfo
    draft: ModelInfo | None = None
    drafter: str = ""
    budget: str = ""
    rollback: str = ""
    compare: str = "greedy"
    seed: int = 0
    versions: dict[str, str] = {}
    device: dict[str, str] = {}
    output_dir: str = ""


def run(cfg: DictConfig, out_dir: str | Path | None = None, on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Run one generation as configured.

    Args:
        cfg: the composed config (conf/config.yaml).
        out_dir: where events.jsonl and summary.json go (default: Hydra's run
            folder, else cfg.output_dir, else ./outputs/last).
        on_event: called with every event as it happens (terminal printer, TUI).
    """
    from specpipe.session import Session

    out = Path(out_dir or cfg.get("output_dir") or _hydra_dir() or "outputs/last")
    session = Session(cfg)
    out.mkdir(parents=True, exist_ok=True)
    prompt_ids = session.encode()
    events = session.generate(prompt_ids, prompt_text=cfg.prompt.text)

    collector = StatsCollector()
    finished: RunFinished | None = None
    with EventWriter(out / "events.jsonl") as writer:
        try:
            for event in events:
                writer.write(event)
                collector.consume(event)
                if on_event:
                    on_event(event)
                if isinstance(event, RunFinished):
                    finished = event
        except KeyboardInterrupt:
            # Ctrl-C landed outside the pipeline (while printing): keep what we have.
            events.close()
        if finished is None:
            finished = RunFinished(stop_reason="interrupted", token_ids=collector.token_ids, text=collector.text, stats=collector.stats())
            writer.write(finished)
            if on_event:
                on_event(finished)

    result = RunResult(
        text=finished.text, tokens=finished.token_ids, stop_reason=finished.stop_reason, stats=finished.stats,
        target=session.target.info, draft=session.draft_info, drafter=session.drafter.name,
        budget=session.budget_label(), rollback=session.rollback.name, compare=session.comparator.name,
        seed=cfg.sampling.seed, versions=versions(), device=device(), output_dir=str(out),
    )
    (out / "summary.json").write_bytes(msgspec.json.format(msgspec.json.encode(result), indent=2))
    if not _hydra_dir():
        (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    return result


def _hydra_dir() -> str | None:
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return HydraConfig.get().runtime.output_dir
    return None


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("specpipe", "mlx", "mlx-lm"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out


def device() -> dict[str, str]:
    import mlx.core as mx

    info = {"mlx_device": str(mx.default_device()), "machine": platform.machine(), "system": platform.system()}
    try:
        from specpipe.engine.blas import blas_info

        blas = blas_info()
        info["blas"] = blas.name
        if blas.path:
            info["blas_path"] = blas.path
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
