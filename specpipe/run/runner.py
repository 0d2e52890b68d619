"""`run(cfg) -> RunResult`: the real entry point, callable without Hydra's CLI.

Loads the models, instantiates the plug-ins named by the config, streams the
pipeline's events into `events.jsonl` (and the terminal), and writes
`summary.json` into the run folder, which it locks first. Each event line is
on disk as soon as it happens and the summary is renamed into place, so a
stop (Ctrl-C, SIGTERM, SIGHUP, a closed pipe) or a full disk keeps every
whole line and, where it fits, the summary. Raises SpecpipeError for bad input.
"""

from __future__ import annotations

import platform
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import msgspec
from omegaconf import DictConfig, OmegaConf

from specpipe.costmodel.worth import StepLog, end_to_end, estimate_speedup
from specpipe.engine.device import device
from specpipe.errors import SpecpipeError
from specpipe.events import Event, EventWriter, ModelInfo, RunFinished, RunStats
from specpipe.metrics import StatsCollector
from specpipe.run import signals
from specpipe.run.run_folder import claim, free_space, hydra_output_dir, reserve_space, write_atomic


class RunResult(msgspec.Struct, kw_only=True):
    text: str
    tokens: list[int]
    stop_reason: str
    stats: RunStats
    target: ModelInfo
    draft: ModelInfo | None = None
    drafter: str = ""
    draft_head_rows: int | None = None  # as RunStarted: the cut draft head's rows (draft.vocab), None = all
    draft_vocab_map: str = ""  # as RunStarted: a draft with another tokenizer's token map, "" = none
    draft_vocab_shared: int | None = None  # ... and the ids both vocabularies share
    budget: str = ""
    rollback: str = ""
    compare: str = "greedy"
    seed: int = 0
    versions: dict[str, str] = {}
    device: dict[str, str] = {}
    output_dir: str = ""
    interrupted_by: str = ""  # "SIGTERM", "Ctrl-C (SIGINT)", ... when stop_reason is "interrupted" or stdout failed
    error: str = ""  # set when the run folder could not be written (disk full); what was kept is said there
    # the cost model's estimate of the speed-up against plain decoding (costmodel/worth.py), 0.0 = none;
    # and where its costs came from: "calibration" (the T(n)/T(1) curve) or "plain steps" (this run's K = 0 timings)
    speedup_estimate: float = 0.0
    speedup_source: str = ""
    # its 90% range (worth.estimate_speedup: the run's steps resampled, the curve's noise); 0.0s: no range
    speedup_low: float = 0.0
    speedup_high: float = 0.0
    # the same for the whole request (worth.end_to_end: prefill of the target and of any draft model included):
    # what a user waits for, beside the decode figure above; 0.0 = none
    speedup_e2e_estimate: float = 0.0
    speedup_e2e_low: float = 0.0
    speedup_e2e_high: float = 0.0


def run(
    cfg: DictConfig, out_dir: str | Path | None = None, on_event: Callable[[Event], None] | None = None
) -> RunResult:
    """Run one generation as configured.

    Args:
        cfg: the composed config (conf/config.yaml).
        out_dir: where events.jsonl and summary.json go (default: Hydra's run
            folder, else cfg.output_dir, else ./outputs/last). The folder is
            locked for this process first (ConfigError when another run holds it).
        on_event: called with every event as it happens (terminal printer, TUI).

    Returns:
        The result; `error` is set (and the run cut short) when the run folder
        could not be written (disk full): whatever could be kept was kept.
    """
    from specpipe.run.session import Session

    option = "output_dir" if cfg.get("output_dir") else "hydra.run.dir"
    out = claim(out_dir or cfg.get("output_dir") or hydra_output_dir() or "outputs/last", option)
    session = Session(cfg, reuse=False)  # one run per session: a prefix store could only cost its copies
    prompt_ids = session.encode()
    try:
        writer = EventWriter(out / "events.jsonl")
    except OSError as exc:
        raise SpecpipeError(
            f"cannot write {out / 'events.jsonl'} ({exc.strerror}): choose another {option}=<folder>"
        ) from exc
    spare = reserve_space(out)  # freed before the summary is written: room for it on a disk that filled up
    events = session.generate(prompt_ids, prompt_text=cfg.prompt.text)

    collector = StatsCollector()
    steps = StepLog()
    finished: RunFinished | None = None
    with writer:
        try:
            for event in events:
                with signals.deferred():  # each event recorded, counted and shown whole, or not at all
                    if isinstance(event, RunFinished):
                        finished = event
                    writer.write(event)
                    collector.consume(event)
                    steps.consume(event)
                    if on_event:
                        on_event(event)
        except KeyboardInterrupt:
            pass  # a stop landed outside the pipeline (recording, printing): keep what we have
        except OSError:
            if writer.failed is None:
                raise
            # the disk filled up: the file ends at its last whole line; the summary says what was kept
        finally:
            events.close()
        if finished is None:
            finished = RunFinished(
                stop_reason="error" if writer.failed else "interrupted",
                token_ids=collector.token_ids,
                text=collector.text,
                stats=collector.stats(),
            )
            with signals.deferred(then_raise=False):  # already stopping: a second signal changes nothing
                _try_write(writer, finished)
                if on_event:
                    on_event(finished)

    result = RunResult(
        text=finished.text,
        tokens=finished.token_ids,
        stop_reason=finished.stop_reason,
        stats=finished.stats,
        target=session.target.info,
        draft=session.draft_info,
        drafter=session.drafter.name,
        draft_head_rows=session.drafter.head_rows,
        draft_vocab_map=session.drafter.vocab_map,
        draft_vocab_shared=session.drafter.vocab_shared,
        budget=session.budget_label(),
        rollback=session.rollback.name,
        compare=session.comparator.name,
        seed=cfg.sampling.seed,
        versions=versions(),
        device=device(),
        output_dir=str(out),
        # a stdout that failed after the last token (stream=false | true) is named too: the text never arrived
        interrupted_by=signals.name() if finished.stop_reason == "interrupted" or signals.stdout_lost() else "",
    )
    # priced from what the run already holds (the budget's curve, a cached calibration, its own step times)
    worth = estimate_speedup(steps, session.budget, session.target, session.drafter)
    result.speedup_estimate, result.speedup_source = worth.value, worth.source
    result.speedup_low, result.speedup_high = worth.low, worth.high
    st = finished.stats
    target_prefill_s = st.prompt_tokens / st.prefill_tok_s if st.prefill_tok_s else 0.0
    whole = end_to_end(worth, st.wall_s, target_prefill_s, st.draft_prefill_s)
    result.speedup_e2e_estimate, result.speedup_e2e_low, result.speedup_e2e_high = whole.value, whole.low, whole.high
    if writer.failed is not None:
        result.error = f"cannot write to {out} ({writer.failed.strerror}) after {len(result.tokens)} tokens"
    kept = []
    free_space(spare)
    with signals.deferred(then_raise=False):  # the run is over: a late signal must not cost its summary
        # the whole summary; if the disk has no room for it, the figures without the tokens (events.jsonl has them)
        for summary in (result, msgspec.structs.replace(result, text="", tokens=[])):
            try:
                write_atomic(out / "summary.json", msgspec.json.format(msgspec.json.encode(summary), indent=2))
                kept.append("summary.json" if summary is result else "summary.json (figures only)")
                break
            except SpecpipeError:
                continue
        if not hydra_output_dir():
            try:
                write_atomic(out / "config.yaml", OmegaConf.to_yaml(cfg).encode())
            except SpecpipeError:
                pass
    if writer.failed is not None:
        what = " and ".join([f"{writer.lines} whole lines of events.jsonl"] + kept)
        result.error += f": kept {what}; free some space or choose another {option}=<folder>"
    elif not kept:
        result.error = f"cannot write {out / 'summary.json'}: the events are in {out / 'events.jsonl'}; free some space"
    return result


def _try_write(writer: EventWriter, event: Event) -> None:
    try:
        writer.write(event)
    except OSError:
        pass  # writer.failed says so; the file still ends with a whole line


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("specpipe", "mlx", "mlx-lm"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "unknown"
    return out
