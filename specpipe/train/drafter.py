"""`specpipe-train-drafter`: train an MTP head (or, kind=eagle3, an EAGLE-3 head: train/eagle3.py) for any
loaded target, offline.

Contract: the target stays frozen; only the head (fc + one block shaped
like the target's last layer, initialised from it + norms) learns to predict
the target's own greedy token two positions ahead from (h[i], embed(t[i+1])).
The corpus defaults to the .py/.md/.rst files shipped with Python and the
installed packages. Target hidden states are computed in chunks, then
trained on. Writes `mtp_head.safetensors` + `mtp_head.json` where
`draft=mtp` looks by default (next to the model) or to `out=`; every
`save_every` steps a checkpoint (head, optimizer, step) makes `resume=true`
continue where it stopped. Same seed, same data order, same head.

    specpipe-train-drafter model=smollm2-135m steps=600
"""

from __future__ import annotations

import json
import os
import random
import sys
import sysconfig
import time
from pathlib import Path
from typing import cast

from specpipe.engine.load.blas import preload_blas

preload_blas()  # before the first `import mlx.core`: optimised BLAS, 15-25x faster CPU matmul

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
from mlx.utils import tree_flatten, tree_unflatten  # noqa: E402

from specpipe.cli.shell import Stopped, hydra_main  # noqa: E402
from specpipe.drafters.mtp_head import default_head_dir, new_head, save_head  # noqa: E402
from specpipe.engine.introspect import llama_parts  # noqa: E402
from specpipe.errors import SpecpipeError  # noqa: E402
from specpipe.run import signals  # noqa: E402
from specpipe.run.run_folder import write_atomic  # noqa: E402

TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt")


# ---------------------------------------------------------------- data


def corpus_files(corpus: str | None, seed: int, max_files: int) -> list[Path]:
    """Text files to train on, in a seeded order."""
    if corpus:
        root = Path(corpus).expanduser()
        if not root.exists():
            raise SpecpipeError(f"corpus={corpus!r} does not exist: give a folder or a text file")
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.suffix in TEXT_SUFFIXES)
    else:
        roots = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]}
        files = sorted(
            p for r in roots for p in Path(r).rglob("*") if p.suffix in TEXT_SUFFIXES and "test" not in p.name
        )
    random.Random(seed).shuffle(files)
    return files[:max_files]


def sequences(target, files: list[Path], seq_len: int):
    """Yield [seq_len] token-id lists cut from the files, in order."""
    buf: list[int] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text) < 200:
            continue
        buf.extend(target.tokenizer.encode(text[:20000]))
        while len(buf) >= seq_len:
            yield buf[:seq_len]
            buf = buf[seq_len:]


def training_stream(target, files: list[Path], cfg):
    """The sequences to train on: corpus cuts, plus (cfg.answers > 0) the target's own chat answers,
    mixed in a seeded order
    so the held-out tail has both kinds. A generator: nothing is generated when precompute finds its cache."""
    n_answers = round(cfg.sequences * cfg.answers)
    if not n_answers:
        yield from sequences(target, files, cfg.seq_len)
        return
    from specpipe.train.answers import answer_sequences

    log = lambda done: print(f"target answers: {done}/{n_answers} sequences", file=sys.stderr)  # noqa: E731
    # answers from the second half of the file order, so the two kinds come from different files
    mixed = answer_sequences(target, files[len(files) // 2 :], n_answers, cfg.seq_len, cfg.seed, log=log)
    mixed += [s for s, _ in zip(sequences(target, files, cfg.seq_len), range(cfg.sequences - len(mixed)))]
    random.Random(cfg.seed).shuffle(mixed)
    yield from mixed


def precompute(inner, lm_head, stream, n_seqs: int, chunk: int, path: Path, log) -> dict:
    """Frozen target passes over n_seqs sequences, `chunk` at a time, cached in `path`.

    Returns {"tokens": [n, T] uint32, "hidden": [n, T, H] float16 (post final norm),
    "labels": [n, T] the target's greedy next token per position}.
    """
    if path.exists():
        return dict(mx.load(str(path)))
    parts: dict[str, list] = {"tokens": [], "hidden": [], "labels": []}
    done = 0
    while done < n_seqs:
        seqs = [s for s, _ in zip(stream, range(min(chunk, n_seqs - done)))]
        if not seqs:
            break
        tokens = mx.array(seqs, dtype=mx.uint32)
        hidden = inner(tokens)  # no cache: a plain causal forward
        labels = mx.argmax(lm_head(hidden), axis=-1).astype(mx.int32)
        mx.eval(hidden, labels)
        for k, v in (("tokens", tokens), ("hidden", hidden.astype(mx.float16)), ("labels", labels)):
            parts[k].append(v)
        done += len(seqs)
        log(done)
    if not done:
        raise SpecpipeError("the corpus gave no sequences: point corpus= at a folder of text or code files")
    data = {k: mx.concatenate(v) for k, v in parts.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with signals.deferred():  # a cache cut in half would be loaded by the next run
        _save_atomic(path, data)
    return data


# ---------------------------------------------------------------- loss


def make_loss(inner, lm_head, unroll: int, ce_weight: float):
    """EAGLE-style: regress the head's output onto the target's next hidden state,
    plus cross-entropy vs the target's greedy token on a few sampled positions
    (the full-vocabulary LM head is the expensive part, so it sees only those).

    Step 1 pairs (h[i], t[i+1]) and should output h[i+1] (whose LM-head argmax is
    label[i+1], the target's token i+2); step j feeds step j-1's output back in,
    as drafting chains do.
    """

    def loss_fn(head, tokens, hidden, labels, pick_b, pick_t):
        # pick_b, pick_t: [ce_positions] rows that get cross-entropy (t < T - unroll: valid at every step)
        x, total = hidden, 0.0
        scale = mx.mean(mx.square(hidden))
        for j in range(1, unroll + 1):
            x = head(x[:, :-1], inner.embed_tokens(tokens[:, j:]))
            total = total + mx.mean(mx.square(x - hidden[:, j:])) / scale / j
            logits = lm_head(x[pick_b, pick_t]).astype(mx.float32)
            total = (
                total + ce_weight * nn.losses.cross_entropy(logits, labels[:, j:][pick_b, pick_t], reduction="mean") / j
            )
        return total

    return loss_fn


def held_out_agreement(head, inner, lm_head, data: dict, rows: list[int], steps: int = 2) -> list[float]:
    """Top-1 agreement of chained head steps 1..steps with the target's greedy token, on sequences never trained on.

    Step 1 is what the first drafted token's acceptance tends to (the head sees the target's own h);
    step 2 feeds step 1's output back in, as drafting does.
    """
    if not rows:
        return []
    idx = mx.array(rows)
    tokens, hidden, labels = data["tokens"][idx], data["hidden"][idx].astype(mx.float32), data["labels"][idx]
    x, out = hidden, []
    for j in range(1, steps + 1):
        x = head(x[:, :-1], inner.embed_tokens(tokens[:, j:]))
        guess = mx.argmax(lm_head(x), axis=-1)
        out.append(mx.mean(guess == labels[:, j:]).item())
    return out


# ---------------------------------------------------------------- loop


def train(cfg) -> Path:
    """Train per `cfg` (conf/train_drafter.yaml); returns the head folder."""
    if not 0.0 <= cfg.answers <= 1.0:
        raise SpecpipeError(f"answers={cfg.answers}: give the share of answer sequences, 0.0..1.0")
    if cfg.kind not in ("mtp", "eagle3"):
        raise SpecpipeError(f"kind={cfg.kind!r}: specpipe-train-drafter trains kind=mtp or kind=eagle3 heads")
    from omegaconf import OmegaConf

    from specpipe.engine.load.loader import load_target

    target = load_target(cfg)
    target.model.freeze()
    if cfg.kind == "eagle3":
        from specpipe.train import eagle3

        return eagle3.train(cfg, target)
    inner, lm_head = llama_parts(target.model, "mtp")
    out = Path(cfg.out).expanduser() if cfg.out else default_head_dir(target.info)
    state_dir = out / "train_state"

    mx.random.seed(cfg.seed)
    head, layer_idx = new_head(inner)
    opt, step = optimizer(cfg, head, state_dir)

    loss_and_grad = nn.value_and_grad(head, make_loss(inner, lm_head, cfg.unroll, cfg.ce_weight))
    files = corpus_files(cfg.corpus, cfg.seed, cfg.max_files)
    answers = f"-answers{cfg.answers:g}" if cfg.answers else ""
    cached = state_dir / f"corpus-{cfg.seed}-{cfg.sequences}x{cfg.seq_len}{answers}.safetensors"
    log = lambda done: print(f"target hidden states: {done}/{cfg.sequences} sequences", file=sys.stderr)  # noqa: E731
    data = precompute(inner, lm_head, training_stream(target, files, cfg), cfg.sequences, cfg.chunk, cached, log)
    n = data["tokens"].shape[0]
    held = list(range(n - n // 16, n)) if n >= 32 else []  # the last 1/16 never trained on: an honest agreement figure
    n -= len(held)
    rng = random.Random(cfg.seed)
    order = [i for _ in range((cfg.steps * cfg.batch) // n + 1) for i in rng.sample(range(n), n)]  # epochs, seeded

    meta = {
        "target": {"name": target.info.name, "arch": target.info.arch, "sha256": target.info.sha256},
        "hidden_size": int(inner.norm.weight.shape[0]),
        "block_from_layer": layer_idx,
        "train": {k: v for k, v in cast(dict, OmegaConf.to_container(cfg)).items() if k not in ("model", "quant")},
    }
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    t0, losses = time.perf_counter(), []
    columns = [
        TextColumn("training MTP head"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    saved = step
    with Progress(*columns, transient=False, console=Console(stderr=True)) as bar:
        task = bar.add_task("train", total=cfg.steps, completed=step, loss="-")
        try:
            while step < cfg.steps:
                idx = mx.array(order[step * cfg.batch : (step + 1) * cfg.batch])
                key = mx.random.key(cfg.seed * 100003 + step)  # per step, so a resumed run draws the same rows
                pick_b = mx.random.randint(0, cfg.batch, (cfg.ce_positions,), key=key)
                pick_t = mx.random.randint(
                    0, cfg.seq_len - cfg.unroll, (cfg.ce_positions,), key=mx.random.split(key)[1]
                )
                batch = (
                    data["tokens"][idx],
                    data["hidden"][idx].astype(mx.float32),
                    data["labels"][idx],
                    pick_b,
                    pick_t,
                )
                with signals.deferred():  # head, optimizer and step move together: a stop lands between steps
                    loss, grads = loss_and_grad(head, *batch)
                    opt.update(head, grads)
                    mx.eval(head.parameters(), opt.state, loss)
                    step += 1
                    losses.append(loss.item())
                bar.update(task, completed=step, loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
                if step % cfg.save_every == 0 or step == cfg.steps:
                    agree = held_out_agreement(head, inner, lm_head, data, held[:16])
                    with signals.deferred():
                        _save_state(state_dir, head, opt, step)
                        save_head(head, out, {**meta, "steps": step, "loss": losses[-1], "held_out_agreement": agree})
                        saved = step
                    if not bar.console.is_terminal:  # logs and pipes get a line per checkpoint
                        print(
                            f"step {step}/{cfg.steps} loss {losses[-1]:.3f} held-out agreement {_pct(agree)} "
                            f"{time.perf_counter() - t0:.0f}s",
                            file=sys.stderr,
                        )
        except KeyboardInterrupt:
            with signals.deferred(then_raise=False):
                if step > saved:
                    _save_state(state_dir, head, opt, step)
                    save_head(head, out, {**meta, "steps": step, "loss": losses[-1], "held_out_agreement": []})
            where = f"checkpoint at step {step}/{cfg.steps} in {state_dir}" if step else "no step was trained"
            raise Stopped(f": {where}; rerun the same command to resume") from None
    agree = held_out_agreement(head, inner, lm_head, data, held)
    with signals.deferred(then_raise=False):  # training is done: a late stop must not cut the head file
        save_head(
            head,
            out,
            {
                **meta,
                "steps": step,
                "loss": losses[-1] if losses else None,
                "held_out_agreement": agree,
                "held_out_sequences": len(held),
                "seconds": round(time.perf_counter() - t0, 1),
            },
        )
    print(
        f"held-out top-1 agreement with the target, chained steps 1..{len(agree)}: {_pct(agree)} "
        f"({len(held)} sequences)",
        file=sys.stderr,
    )
    print(
        f"saved MTP head ({step} steps) to {out}: run with draft=mtp" + (f" draft.head={out}" if cfg.out else ""),
        file=sys.stderr,
    )
    return out


def optimizer(cfg, head, state_dir: Path) -> tuple[optim.Optimizer, int]:
    """AdamW under warm-up then cosine decay (cfg.lr, cfg.warmup, cfg.steps), and the step to start at: the saved
    one when cfg.resume finds a state in `state_dir` (head and optimizer restored), else 0. Every head kind's."""
    opt = optim.AdamW(
        learning_rate=optim.join_schedules(
            [
                optim.linear_schedule(cfg.lr * 0.01, cfg.lr, cfg.warmup),
                optim.cosine_decay(cfg.lr, max(cfg.steps - cfg.warmup, 1), cfg.lr * 0.05),
            ],
            [cfg.warmup],
        ),
        weight_decay=0.0,
    )
    step = 0
    if cfg.resume and (state_dir / "state.json").exists():
        step = _load_state(state_dir, head, opt)
        print(f"resuming at step {step} from {state_dir}", file=sys.stderr)
    return opt, step


def _pct(values: list[float]) -> str:
    return " / ".join(f"{v:.0%}" for v in values) if values else "n/a (under 32 sequences)"


def _save_state(folder: Path, head, opt, step: int) -> None:
    """Head, optimizer, then state.json (the step), each through a temp file + rename."""
    folder.mkdir(parents=True, exist_ok=True)
    _save_atomic(folder / "head.safetensors", dict(tree_flatten(head.parameters())))
    _save_atomic(folder / "optimizer.safetensors", dict(tree_flatten(opt.state)))
    write_atomic(folder / "state.json", (json.dumps({"step": step}) + "\n").encode())


def _save_atomic(path: Path, arrays: dict) -> None:
    tmp = path.with_name(f".{path.stem}.tmp.safetensors")
    mx.save_safetensors(str(tmp), arrays)
    os.replace(tmp, path)


def _load_state(folder: Path, head, opt) -> int:
    head.load_weights(str(folder / "head.safetensors"))
    opt.state = tree_unflatten(list(mx.load(str(folder / "optimizer.safetensors")).items()))
    return json.loads((folder / "state.json").read_text())["step"]


def main() -> None:
    """Console entry: Hydra app over conf/train_drafter.yaml; errors become one line (docs/faults.md)."""
    hydra_main(
        "specpipe-train-drafter", "train_drafter", train, interrupted=" before training started; nothing was saved"
    )


if __name__ == "__main__":
    main()
