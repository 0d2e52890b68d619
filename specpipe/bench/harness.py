"""`specpipe-bench`: for every prompt of a suite, the baseline (`draft=none`)
and the speculative run back to back on one shared target, plus mlx-lm's
own generation on the same model objects as an in-run anchor.

Contract: `run_bench(cfg, results)` appends one JSONL line per (config,
prompt) to `results` as soon as it is measured, each with the resolved
config, its hash and both runs' figures; it flags (never fails on) greedy
token mismatches. `main()` is the Hydra app over `conf/bench.yaml`: user
errors are one line on stderr (config 2, run 1, Ctrl-C 130, SIGTERM 143,
SIGHUP 129) as in cli.py; a stop keeps every finished prompt's record.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

from specpipe.budgets.fixed import FixedBudget
from specpipe.cli.shell import Stopped, hydra_main, print_result

RESULTS_NAME = "bench.jsonl"
WARMUP_TOKENS = 8
SESSION_KEYS = (
    "model",
    "draft",
    "quant",
    "budget",
    "rollback",
    "compare",
    "sampling",
    "tree",
    "kv",
    "prefill",
    "max_tokens",
)

_loaded_target: dict = {}  # model spec -> Engine: multirun jobs share one process, so load once


def main() -> None:
    hydra_main("specpipe-bench", "bench", _task, interrupted=": no prompt had finished; nothing was written")


def _task(cfg) -> None:
    results = Path(cfg.results) if cfg.results else _hydra_results_dir() / RESULTS_NAME
    try:
        records = run_bench(cfg, results)
    except KeyboardInterrupt:
        if not results.exists():
            raise
        raise Stopped(f": every finished prompt is in {results} (rerun with resume=true results={results})") from None
    from specpipe.bench.report import verdicts

    lines = list(verdicts(records))
    if lines:
        print_result("specpipe-bench", "\n".join(lines), f"every measured prompt is in {results}")
    bad = sum(not r["tokens_match"] for r in records)
    bad += sum(run.get("first_mismatch") is not None for r in records for run in (r.get("fixed") or {}).values())
    flag = f", {bad} TOKEN MISMATCHES (see the report)" if bad else ""
    print(f"specpipe-bench: {len(records)} prompts measured{flag} -> {results}", file=sys.stderr)


def _hydra_results_dir() -> Path:
    """The sweep folder for multirun (all jobs share one JSONL), the run folder otherwise."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    return Path(hc.sweep.dir if hc.mode == RunMode.MULTIRUN else hc.runtime.output_dir)


# ---------------------------------------------------------------- the measurement loop


def run_bench(cfg, results: str | Path, log=None) -> list[dict]:
    """Measure every pending prompt of `cfg.suite` under `cfg`; append each record to `results`.

    Args:
        cfg: a composed bench config (conf/bench.yaml).
        results: the JSONL file to append to (created if missing).
        log: progress sink, one line per prompt (default: stderr).

    Returns:
        The records measured by this call (not those skipped by resume).
    """
    from omegaconf import OmegaConf

    from specpipe.bench.measure import measure_mlx_lm, measure_specpipe
    from specpipe.bench.noise import suspect
    from specpipe.bench.records import ResultsFile, config_hash, first_mismatch, load_suite, prompt_key
    from specpipe.config.config_groups import group_option
    from specpipe.engine.device import device
    from specpipe.errors import SpecpipeError
    from specpipe.run import signals
    from specpipe.run.runner import versions
    from specpipe.run.session import Session

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    snapshot = cast(dict, OmegaConf.to_container(cfg, resolve=True))
    snapshot.pop("hydra", None)
    chash = config_hash(snapshot)
    out = ResultsFile(results)
    if cfg.repeats < 1:
        raise SpecpipeError(
            f"repeats={cfg.repeats}: measure each prompt at least once (repeats=1, or 3 on a noisy machine)"
        )
    prompts = load_suite(
        cfg.suite.name, cfg.suite.path, cfg.limit, cfg.suite.format, cfg.suite.per_category, cfg.suite.second_turns
    )
    multi_request = any("session" in p for p in prompts)  # suite=sessions: history carried between requests
    if multi_request and (cfg.repeats > 1 or cfg.fixed_ks):
        raise SpecpipeError(
            f"suite={cfg.suite.name} carries each session's history from request to request: a repeat or a fixed-K "
            "run would draft from its own earlier answer; use repeats=1 fixed_ks=null (and alternate sittings)"
        )
    done = out.done_pairs() if cfg.resume else set()
    pending = [p for p in prompts if (chash, prompt_key(p)) not in done]  # an edited prompt is measured again
    if len(pending) < len(prompts):
        log(f"[bench] resume: {len(prompts) - len(pending)} of {len(prompts)} prompts already in {out.path}")
    if not pending:
        return []

    # One target for both sessions: the A/B pair differs only in the drafter.
    spec = Session(session_config(cfg, cfg.draft), target=_shared_target(cfg))
    # The baseline drafts nothing, so its budget only has to exist: a fixed one skips any calibration.
    baseline = session_config(cfg, group_option("draft", "none"), group_option("budget", "fixed", k=1))
    base = Session(baseline, target=spec.target)
    fixed = {k: with_budget(spec, FixedBudget(k=k)) for k in sorted(set(cfg.fixed_ks or []))}
    greedy = cfg.sampling.temperature == 0
    # mlx-lm can only draft with a whole model: draft=model (incl. self), not n-gram / layer-skip / heads.
    # A draft with another tokenizer (draft.vocab_map) is not one mlx-lm can use: its anchor decodes plain.
    drafts_for_mlx = spec.drafter.name == "model" and spec.drafter.engine and not spec.drafter.vocab_map
    anchor_draft = spec.drafter.engine.model if drafts_for_mlx and spec.drafter.engine else None
    # mlx-lm drafts a fixed K: a fixed budget's, else an adaptive budget's starting k (4 if it has none).
    k = cfg.budget.get("k", None) or 4
    label = {
        "model": spec.target.info.name,
        "precision": spec.target.info.precision,
        "drafter": spec.drafter.name,
        "draft_model": draft_label(spec),
        "budget": spec.budget_label(),
        "k": k,
        "suite": cfg.suite.name if not cfg.suite.path else Path(cfg.suite.path).stem,
    }

    answers: dict[str, list[int]] = {}  # prompt id -> plain decoding's answer, for a second turn that follows it

    def encode(prompt: dict) -> list[int]:
        if "after" in prompt:  # an MT-Bench second turn: the first turn and the target's own answer come first
            first = prompt["after"]
            if first["id"] not in answers:  # measured in an earlier (resumed) run, or cut by limit
                answers[first["id"]] = measure_specpipe(base, encode(first), cfg.max_tokens)["token_ids"]
            system = [{"role": "system", "content": cfg.suite.system}] if cfg.suite.system else []
            ids = spec.target.encode_messages(
                [
                    *system,
                    {"role": "user", "content": first["prompt"]},
                    {"role": "assistant", "content": spec.target.decode(answers[first["id"]])},
                    {"role": "user", "content": prompt["prompt"]},
                ]
            )
        else:
            ids = spec.target.encode_prompt(prompt["prompt"], cfg.suite.chat, prompt.get("system", cfg.suite.system))
        spec.target.check_prompt_fits(len(ids))  # e.g. suite=longctx-32k on SmolLM2: one line, before any prefill
        return ids

    anchor_ks = sorted(set(cfg.anchor_ks or [k])) if anchor_draft is not None else []

    def anchor_runs(ids: list[int], max_tokens: int) -> dict:
        # The target's own model object: no patch reaches it (the engine's mixer wrappers exist only during
        # its capturing forwards; measure_mlx_lm checks), so this is mlx-lm as its users run it, at the memory
        # of one load rather than two.
        model, tok = spec.target.model, spec.target.tokenizer
        plain = measure_mlx_lm(model, tok, ids, max_tokens, sampling=snapshot["sampling"])
        sweep = {
            str(ak): measure_mlx_lm(model, tok, ids, max_tokens, anchor_draft, ak, sampling=snapshot["sampling"])
            for ak in anchor_ks
        }
        # "spec" stays mlx-lm at the budget's k (or the sweep's first K when k is not swept).
        spec_run = sweep.get(str(k)) or next(iter(sweep.values()), None)
        return {"plain": plain, "spec": spec_run, "sweep": sweep if len(sweep) > 1 else None}

    if cfg.warmup:
        # Untimed: first calls pay for allocation and BLAS thread start-up.
        ids = encode(pending[0])
        n = min(WARMUP_TOKENS, cfg.max_tokens)
        measure_specpipe(base, ids, n)
        measure_specpipe(spec, ids, n)
        for session in fixed.values():
            measure_specpipe(session, ids, n)
        if cfg.anchor:
            anchor_runs(ids, n)

    def ab_figures(i: int, ids: list[int]) -> dict:
        """The A/B pair's part of a record: every path `cfg.repeats` times, the median run of each kept."""
        # A/B interleaved, alternating which goes first so slow drift in a shared machine cancels out.
        # Fixed-K runs join the rotation: every path of one repeat is measured back to back.
        paths = {"baseline": base, "spec": spec, **{str(k): session for k, session in fixed.items()}}
        runs: dict[str, list[dict]] = {name: [] for name in paths}
        for r in range(cfg.repeats):
            order = list(paths) if (i + r) % 2 == 0 else list(paths)[::-1]
            for name in order:
                runs[name].append(measure_specpipe(paths[name], ids, cfg.max_tokens))
        b, s = median_run(runs["baseline"]), median_run(runs["spec"])
        fixed_runs = {k: median_run(runs[k]) for k in runs if k not in ("baseline", "spec")}
        for run in fixed_runs.values():
            run["speedup"] = _ratio(run["decode_tok_s"], b["decode_tok_s"])
            run["speedup_e2e"] = _ratio(run["e2e_tok_s"], b["e2e_tok_s"])
            run["first_mismatch"] = first_mismatch(b["token_ids"], run["token_ids"]) if greedy else None
        mismatch = first_mismatch(b["token_ids"], s["token_ids"]) if greedy else None
        return {
            "baseline": b,
            "spec": s,
            "speedup": _ratio(s["decode_tok_s"], b["decode_tok_s"]),
            "speedup_e2e": _ratio(s["e2e_tok_s"], b["e2e_tok_s"]),
            "first_mismatch": mismatch,
            "tokens_match": mismatch is None,
            "fixed": fixed_runs or None,
        }

    spec.history.clear()  # draft=suffix: the warm-up's requests are no one's history
    env = {"versions": versions(), "device": device()}
    from specpipe.engine.load.blas import blas_info, blas_phrase

    log(f"[bench] {label['model']} ({label['precision']}), {len(pending)} prompts, {blas_phrase(blas_info())}")
    records = []
    started = time.perf_counter()
    for i, prompt in enumerate(pending):
        if multi_request and (i == 0 or prompt.get("session") != pending[i - 1].get("session")):
            spec.history.clear()  # a new session starts with no history, as a new chat or server would
        ids = encode(prompt)
        record = {
            "config_hash": chash,
            "config": snapshot,
            "label": label,
            "prompt_id": prompt["id"],
            "prompt_key": prompt_key(prompt),
            "category": prompt.get("category"),  # Spec-Bench's task; the report groups by it
            "question": prompt.get("question"),  # Spec-Bench's question_id and category, for its answer files
            "turn": 2 if "after" in prompt else 1,
            "session": prompt.get("session"),  # suite=sessions: the session this request belongs to
            "history": prompt.get("history"),  # suite=sessions: repeats earlier answers, not its own prompt
            "prompt_tokens": len(ids),
            "order": "baseline-first" if i % 2 == 0 else "spec-first",
            **ab_figures(i, ids),
            "greedy": greedy,
            "anchor": None,
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            **env,
        }
        b = record["baseline"]
        answers[prompt["id"]] = b["token_ids"]
        if cfg.anchor:
            a = anchor_runs(ids, cfg.max_tokens)
            for run in (a["plain"], *(a["sweep"] or {"k": a["spec"]}).values()):
                if run is not None:
                    run["first_mismatch"] = first_mismatch(b["token_ids"], run["token_ids"]) if greedy else None
            a["speedup"] = _ratio(a["spec"]["decode_tok_s"], a["plain"]["decode_tok_s"]) if a["spec"] else None
            a["speedup_e2e"] = _ratio(a["spec"]["e2e_tok_s"], a["plain"]["e2e_tok_s"]) if a["spec"] else None
            for run in (a["sweep"] or {}).values():
                run["speedup"] = _ratio(run["decode_tok_s"], a["plain"]["decode_tok_s"])
                run["speedup_e2e"] = _ratio(run["e2e_tok_s"], a["plain"]["e2e_tok_s"])
            record["anchor"] = a
        why = suspect(record)
        if why and multi_request:  # measured again, it would draft from its own answer: flagged as it stands
            record["noise"] = {"first": why, "flag": why}
        elif why:  # one noisy timing: measure the pair again (the other order first), flag it if it stays
            log(f"[bench] {prompt['id']}: {why}; measuring it again")
            record.update(ab_figures(i + 1, ids))
            record["noise"] = {"first": why, "flag": suspect(record)}
        with signals.deferred():  # a stop never cuts a record line in half
            out.append(record)
        records.append(record)
        log(progress_line(i + 1, len(pending), record, time.perf_counter() - started))
        if multi_request and (i + 1 == len(pending) or pending[i + 1].get("session") != prompt.get("session")):
            from specpipe.bench.sessions import session_line

            log(session_line([r for r in records if r["session"] == prompt.get("session")]))
    if multi_request:
        from specpipe.bench.sessions import suite_lines

        for line in suite_lines(records):
            log(line)
    _write_answers(out, chash, {prompt_key(p) for p in prompts}, spec.target.decode, log)
    return records


def _write_answers(out, chash: str, keys: set[str], decode, log) -> None:
    """Spec-Bench answer files of every question of the suite this config measured (resumed ones too)."""
    from specpipe.bench.answer_files import ANSWERS_DIR, write_answer_files

    mine = [r for r in out.records() if r.get("config_hash") == chash and r.get("prompt_key") in keys]
    paths = write_answer_files(mine, out.path.parent / ANSWERS_DIR, decode)
    if paths:
        log(f"[bench] Spec-Bench answer files: {', '.join(str(p) for p in paths)}")


def with_budget(session, budget):
    """The same session (target, drafter, stages) drafting under another budget: a fixed-K run beside auto."""
    import copy

    twin = copy.copy(session)
    twin.budget = budget
    return twin


def median_run(runs: list[dict]) -> dict:
    """The run with the median decode speed (upper median for an even count), with every run's speed beside it."""
    run = sorted(runs, key=lambda r: r["decode_tok_s"])[len(runs) // 2]
    if len(runs) > 1:
        run["decode_tok_s_runs"] = [r["decode_tok_s"] for r in runs]
    return run


def session_config(cfg, draft, budget=None):
    """The Session's view of a bench config: its groups (draft and budget replaceable), a prompt node from the suite."""
    from omegaconf import OmegaConf

    def plain(node):
        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node

    node = {key: plain(cfg[key]) for key in SESSION_KEYS}
    node["draft"] = dict(plain(draft))
    if budget is not None:
        node["budget"] = dict(budget)
    node["prompt"] = {"text": "", "chat": cfg.suite.chat, "system": cfg.suite.system}
    node["stream"] = False
    return OmegaConf.create(node)


def draft_label(spec) -> str | None:
    """The draft model's name for reports; a draft with another tokenizer names its token map, so the report
    keeps `intersection` and `text` runs of one draft apart (smollm2-135m vocab_map=text)."""
    if not spec.draft_info:
        return "self" if spec.drafter.name == "model" else None
    mapped = spec.drafter.vocab_map
    return f"{spec.draft_info.name} vocab_map={mapped}" if mapped else spec.draft_info.name


def _shared_target(cfg):
    """The target Engine, loaded once per process and reused by later sweep jobs with the same model."""
    from omegaconf import OmegaConf

    from specpipe.engine.load.loader import load_target

    key = repr((OmegaConf.to_container(cfg.model, resolve=True), cfg.quant.precision))
    if key not in _loaded_target:
        _loaded_target.clear()  # at most one target in memory
        _loaded_target[key] = load_target(cfg)
    return _loaded_target[key]


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def progress_line(n: int, total: int, r: dict, elapsed: float) -> str:
    lab = r["label"]
    eta = elapsed / n * (total - n)
    mismatch = "" if r["tokens_match"] else f" MISMATCH at token {r['first_mismatch']}"
    anchor = ""
    if r["anchor"]:
        a = r["anchor"]
        # every K of mlx-lm's sweep, not only the first: its best K is what auto is held against
        runs = list((a["sweep"] or {}).values()) or ([a["spec"]] if a["spec"] else [])
        anchor = (
            f" | mlx-lm plain {a['plain']['decode_tok_s']:.1f}"
            + "".join(f", K={run['num_draft_tokens']} {run['decode_tok_s']:.1f}" for run in runs)
            + " tok/s"
        )
    fixed = "".join(f" K={k} {run['speedup']:.2f}x" for k, run in (r.get("fixed") or {}).items())
    s = r["spec"]
    return (
        f"[bench {n}/{total}] {lab['suite']}/{r['prompt_id']} {lab['drafter']} {lab['budget']}: "
        f"{r['baseline']['decode_tok_s']:.1f} -> {s['decode_tok_s']:.1f} tok/s ({r['speedup']:.2f}x), "
        f"acceptance {s['acceptance_rate']:.0%}, draft forwards {s.get('draft_forwards', 0)} for {s['drafted']} drafted"
        f"{' |' + fixed if fixed else ''}{anchor}{mismatch} | ETA {eta:.0f}s"
    )


if __name__ == "__main__":
    main()
