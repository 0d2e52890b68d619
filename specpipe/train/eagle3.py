"""`specpipe-train-drafter kind=eagle3`: train an EAGLE-3 head for a frozen target, written in the
speculators layout that `draft=eagle3` (and vLLM / SGLang) load.

Contract: the target's taps (the inputs of EAGLE's low / mid / high layers 2, N//2, N-3, or `layers=`)
and greedy next tokens are computed once over the corpus, in chunks, and cached; the head (fc over
the taps, one EAGLE-3 decoder layer, norm, an LM head over the `draft_vocab` ids the target emits most
often in that data: d2t / t2d) learns to predict the target's greedy token. The training-time test of
EAGLE-3: step 1 pairs (taps[i-1], t[i]) -> label[i]; each of `unroll - 1` more steps feeds the
previous step's own outputs back in place of the taps (x[i-1], t[i]) -> label[i], as drafting chains
do, weighted 0.8^(step-1) as in EAGLE-3, and attends to what the head's cache holds when drafting (step 1's
keys for the context, one key per earlier chained step: train/eagle3_ttt.py). Same seed, same data order,
same head; `resume=true` continues from out/train_state.

    specpipe-train-drafter kind=eagle3 model=smollm2-135m steps=600 out=/tmp/eagle3-head
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from specpipe.drafters.eagle3.export import save_speculators
from specpipe.drafters.eagle3.head import Eagle3Head, HeadConfig
from specpipe.drafters.mtp_head import default_head_dir
from specpipe.engine.engine import Capture
from specpipe.engine.introspect import llama_parts, lm_head_weights
from specpipe.engine.layer_taps import check_layers, default_layers
from specpipe.errors import SpecpipeError
from specpipe.run import signals
from specpipe.train import drafter as common
from specpipe.train.eagle3_ttt import ttt_steps

STEP_DECAY = 0.8  # EAGLE-3's weight of chained step j: 0.8 ** (j - 1)


def head_config(target, inner, draft_vocab: int) -> HeadConfig:
    """The head's shapes from the target's: EAGLE-3 heads are one layer of the target's width."""
    args = target.model.args
    hidden, heads = int(args.hidden_size), int(args.num_attention_heads)
    vocab = int(inner.embed_tokens.weight.shape[0])
    return HeadConfig(
        hidden_size=hidden,
        target_hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(args, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(args, "head_dim", None) or hidden // heads),
        intermediate_size=int(args.intermediate_size),
        vocab_size=vocab,
        draft_vocab_size=min(draft_vocab, vocab),
        rms_norm_eps=float(getattr(args, "rms_norm_eps", 1e-6)),
        rope_theta=float(getattr(args, "rope_theta", 10000.0)),
        max_position_embeddings=int(getattr(args, "max_position_embeddings", None) or 4096),
        has_embedding=False,  # the target's embedding (vLLM's rule for a head that ships none)
    )


def precompute(target, taps: tuple[int, ...], stream, n_seqs: int, chunk: int, path: Path, log) -> dict:
    """{"tokens": [n, T] uint32, "taps": [n, T, 3H] float16, "labels": [n, T] the target's greedy next token},
    cached in `path` (the frozen target runs once per corpus)."""
    if path.exists():
        return dict(mx.load(str(path)))
    parts: dict[str, list] = {"tokens": [], "taps": [], "labels": []}
    done = 0
    while done < n_seqs:
        seqs = [s for s, _ in zip(stream, range(min(chunk, n_seqs - done)))]
        if not seqs:
            break
        tokens = mx.array(seqs, dtype=mx.uint32)
        out = target.forward(tokens, None, capture=Capture(layers=taps))  # [B, T]: a plain causal forward
        labels = mx.argmax(out.logits, axis=-1).astype(mx.int32)
        rows = out.layer_hidden.astype(mx.float16)
        mx.eval(rows, labels)
        for k, v in (("tokens", tokens), ("taps", rows), ("labels", labels)):
            parts[k].append(v)
        done += len(seqs)
        log(done)
    if not done:
        raise SpecpipeError("the corpus gave no sequences: point corpus= at a folder of text or code files")
    data = {k: mx.concatenate(v) for k, v in parts.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with signals.deferred():  # a cache cut in half would be loaded by the next run
        common._save_atomic(path, data)
    return data


def draft_vocabulary(labels: mx.array, vocab: int, size: int) -> np.ndarray:
    """The `size` target ids the target emits most often in the data (ties: lower id), sorted: EAGLE-3's rule."""
    counts = np.bincount(np.array(labels).ravel(), minlength=vocab)
    keep = np.argsort(-counts, kind="stable")[:size]
    return np.sort(keep)


def new_head(target, inner, lm_head_weight: mx.array, cfg: HeadConfig, ids: np.ndarray) -> Eagle3Head:
    """A head initialised where the target helps: its LM head's rows of the draft vocabulary, its final norm
    and its last layer's MLP and post-attention norm; fc and attention (2H wide) start random."""
    head = Eagle3Head(cfg, embed=inner.embed_tokens)
    last = inner.layers[-1]
    layer = head.layers[0]
    layer.mlp.update(last.mlp.parameters())
    layer.post_attention_layernorm.update(last.post_attention_layernorm.parameters())
    head.norm.update(inner.norm.parameters())
    head.lm_head.weight = lm_head_weight[mx.array(ids)].astype(mx.float32)
    if cfg.draft_vocab_size != cfg.vocab_size:
        head.set_vocab_map(mx.array(ids - np.arange(len(ids)), dtype=mx.int32))
    return head


def make_loss(unroll: int, t2d_index: mx.array):
    """Cross-entropy over the draft vocabulary of each chained step (train/eagle3_ttt.py); labels outside it
    are left out."""

    def loss_fn(head, tokens, taps, labels):
        total = 0.0
        for j, (logits, _) in enumerate(ttt_steps(head, tokens, taps, unroll), start=1):
            want = t2d_index[labels[:, j:]]  # -1: the target's token is outside the draft vocabulary
            inside = want >= 0
            ce = nn.losses.cross_entropy(logits.astype(mx.float32), mx.maximum(want, 0), reduction="none")
            total = total + STEP_DECAY ** (j - 1) * (ce * inside).sum() / mx.maximum(inside.sum(), 1)
        return total

    return loss_fn


def held_out_agreement(head, data: dict, rows: list[int], t2d_index: mx.array, steps: int = 3) -> list[float]:
    """Top-1 agreement of chained steps 1..steps with the target's greedy token on sequences never trained on,
    each step fed the true tokens before it (what drafting sees when the earlier drafts were right)."""
    if not rows:
        return []
    idx = mx.array(rows)
    tokens, taps, labels = data["tokens"][idx], data["taps"][idx].astype(mx.float32), data["labels"][idx]
    return [
        mx.mean(mx.argmax(logits, axis=-1) == t2d_index[labels[:, j:]]).item()
        for j, (logits, _) in enumerate(ttt_steps(head, tokens, taps, steps), start=1)
    ]


def train(cfg, target) -> Path:
    """Train per `cfg` (conf/train_drafter.yaml, kind=eagle3) against the loaded, frozen `target`."""
    inner, _ = llama_parts(target.model, "eagle3")
    n_layers = len(inner.layers)
    taps = tuple(cfg.layers) if cfg.layers else default_layers(n_layers)
    check_layers(taps, n_layers)
    if cfg.unroll < 1:
        raise SpecpipeError(f"unroll={cfg.unroll}: train at least one head step (unroll=1)")
    beside = default_head_dir(target.info)  # next to the model, where draft=mtp's head would go
    out = (
        Path(cfg.out).expanduser()
        if cfg.out
        else beside.with_name(beside.name.replace(".mtp-head", "") + ".eagle3-head")
    )
    state_dir = out / "train_state"
    mx.random.seed(cfg.seed)

    files = common.corpus_files(cfg.corpus, cfg.seed, cfg.max_files)
    answers = f"-answers{cfg.answers:g}" if cfg.answers else ""
    tag = "-".join(str(i) for i in taps)
    cached = state_dir / f"eagle3-corpus-{cfg.seed}-{cfg.sequences}x{cfg.seq_len}{answers}-taps{tag}.safetensors"
    log = lambda done: print(f"target taps: {done}/{cfg.sequences} sequences", file=sys.stderr)  # noqa: E731
    data = precompute(target, taps, common.training_stream(target, files, cfg), cfg.sequences, cfg.chunk, cached, log)

    hcfg = head_config(target, inner, cfg.draft_vocab)
    ids = draft_vocabulary(data["labels"], hcfg.vocab_size, hcfg.draft_vocab_size)
    t2d_index = np.full(hcfg.vocab_size, -1, dtype=np.int32)
    t2d_index[ids] = np.arange(len(ids))
    t2d = mx.array(t2d_index)
    # the rows the LM head reads (lm_head, or the tied embedding's): `lm_head` may be a soft-capping function
    lm_weight = lm_head_weights(target.model, inner).weight
    head = new_head(target, inner, lm_weight, hcfg, ids)
    opt, step = common.optimizer(cfg, head, state_dir)
    loss_and_grad = nn.value_and_grad(head, make_loss(cfg.unroll, t2d))

    n = data["tokens"].shape[0]
    held = list(range(n - n // 16, n)) if n >= 32 else []  # the last 1/16 never trained on
    n -= len(held)
    rng = random.Random(cfg.seed)
    order = [i for _ in range((cfg.steps * cfg.batch) // n + 1) for i in rng.sample(range(n), n)]
    meta = {
        "kind": "eagle3",
        "target": {"name": target.info.name, "arch": target.info.arch, "sha256": target.info.sha256},
        "taps": list(taps),
        "draft_vocab_size": hcfg.draft_vocab_size,
        "train": {k: cfg[k] for k in ("sequences", "seq_len", "batch", "unroll", "lr", "seed", "steps")},
    }

    def save(agree: list[float], **extra) -> None:
        common._save_state(state_dir, head, opt, step)
        body = {**meta, "steps": step, "loss": losses[-1] if losses else None, "held_out_agreement": agree, **extra}
        save_speculators(out, head, taps, target.info.name, body)

    t0, losses, saved = time.perf_counter(), list[float](), step
    try:
        while step < cfg.steps:
            idx = mx.array(order[step * cfg.batch : (step + 1) * cfg.batch])
            batch = (data["tokens"][idx], data["taps"][idx].astype(mx.float32), data["labels"][idx])
            with signals.deferred():  # head, optimizer and step move together: a stop lands between steps
                loss, grads = loss_and_grad(head, *batch)
                opt.update(head, grads)
                mx.eval(head.parameters(), opt.state, loss)
                step += 1
                losses.append(loss.item())
            if step % cfg.save_every == 0 or step == cfg.steps:
                agree = held_out_agreement(head, data, held[:16], t2d)
                with signals.deferred():
                    save(agree)
                    saved = step
                print(
                    f"step {step}/{cfg.steps} loss {losses[-1]:.3f} held-out agreement {common._pct(agree)} "
                    f"{time.perf_counter() - t0:.0f}s",
                    file=sys.stderr,
                )
    except KeyboardInterrupt:
        with signals.deferred(then_raise=False):
            if step > saved:
                save([])
        from specpipe.cli.shell import Stopped

        where = f"checkpoint at step {step}/{cfg.steps} in {state_dir}" if step else "no step was trained"
        raise Stopped(f": {where}; rerun the same command to resume") from None
    agree = held_out_agreement(head, data, held, t2d)
    with signals.deferred(then_raise=False):
        save(agree, held_out_sequences=len(held), seconds=round(time.perf_counter() - t0, 1))
    print(
        f"held-out top-1 agreement with the target, chained steps 1..{len(agree)}: {common._pct(agree)} "
        f"({len(held)} sequences)",
        file=sys.stderr,
    )
    print(f"saved EAGLE-3 head ({step} steps) to {out}: run with draft=eagle3 draft.path={out}", file=sys.stderr)
    return out
