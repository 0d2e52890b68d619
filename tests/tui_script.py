"""A scripted run for TUI tests: fixed events with accepted, rejected, recovered
and bonus tokens, fixed timings, no model (deterministic snapshots)."""

from __future__ import annotations

import msgspec

from specpipe.events import (
    Drafted,
    Emitted,
    ModelInfo,
    PrefillDone,
    RolledBack,
    RunFinished,
    RunStarted,
    RunStats,
    Verified,
)
from specpipe.metrics import StatsCollector

CONFIG_YAML = "model:\n  name: scripted\ndraft:\n  name: ngram\nbudget:\n  k: 4\nmax_tokens: 64\n"

# (draft token texts, accepted count, target token text); ids are indexes into VOCAB.
STEPS = [
    (["def", " add", "(a", ","], 4, " b"),  # all four accepted -> bonus
    (["):", "\n", "    return", " a"], 2, "    "),  # two accepted, recovered "    " instead of "    return"
    (["return", " a", " +", " b"], 4, "\n"),  # bonus
    ([], 0, "# done"),  # plain step: nothing drafted
]

VOCAB = list(dict.fromkeys(text for draft, _, target in STEPS for text in [*draft, target]))  # id = index


def scripted_events(prompt: str = "Write add(a, b) in Python", with_texts: bool = True) -> list:
    """The scripted run; `with_texts=False` leaves out Emitted.token_texts and
    Verified.rejected_text, as recordings made before those fields did."""
    tid = VOCAB.index

    info = ModelInfo(name="scripted", source="tiny-random", arch="llama", precision="float32")
    events: list = [
        RunStarted(
            t=0.0,
            target=info,
            drafter="ngram",
            budget="fixed(k=4)",
            rollback="trim",
            prompt_text=prompt,
            prompt_ids=[1, 2, 3, 4, 5],
            max_tokens=64,
            config_yaml=CONFIG_YAML,
        ),
        PrefillDone(t=0.1, tokens=5, seconds=0.1),
    ]
    t, out_ids, out_text = 0.1, [], ""
    for step, (draft, n, target_text) in enumerate(STEPS, start=1):
        draft_ids = [tid(x) for x in draft]
        target_id = tid(target_text)
        full = n == len(draft_ids)
        t += 0.05
        events.append(Drafted(t=t, step=step, k=4, draft_ids=draft_ids, seconds=0.01))
        events.append(
            Verified(
                t=t + 0.02,
                step=step,
                accepted_ids=draft_ids[:n],
                rejected_ids=draft_ids[n:],
                recovered_id=None if full else target_id,
                bonus_id=target_id if full else None,
                seconds=0.02,
                rejected_text="".join(draft[n:]) if with_texts else "",
            )
        )
        events.append(
            RolledBack(
                t=t + 0.03, step=step, strategy="trim", target_dropped=len(draft_ids) - n, draft_dropped=0, seconds=0.0
            )
        )
        kept = draft_ids[:n] + [target_id]
        text = "".join(draft[:n]) + target_text
        t += 0.05
        texts = draft[:n] + [target_text] if with_texts else []
        events.append(Emitted(t=t, step=step, token_ids=kept, text=text, from_draft=n, token_texts=texts))
        out_ids += kept
        out_text += text
    stats = RunStats(
        prompt_tokens=5,
        generated_tokens=len(out_ids),
        steps=len(STEPS),
        target_forwards=len(STEPS),
        drafted=12,
        accepted=10,
        peak_memory_bytes=300 * 2**20,
    )
    events.append(RunFinished(t=t + 0.01, stop_reason="eos", token_ids=out_ids, text=out_text, stats=stats))
    return events


def scripted_decode(ids: list[int]) -> str:
    """ids -> text for the scripted vocabulary (stands in for a live tokenizer)."""
    return "".join(VOCAB[i] for i in ids)


EXPECTED_TEXT = "def add(a, b):\n    return a + b\n# done"


# A token-tree run (tree != chain): per step the tree's (token text, parent) nodes, the accepted path
# (node indices) and the target's next token text.
TREE_STEPS = [
    ([("def", -1), (" add", 0), (" sum", 0), ("class", -1)], [0, 1], "(a"),  # 3 branches, path def add
    ([(",", -1), (" b", 0), (")", -1)], [], ", "),  # 2 branches, none accepted
    ([(" b", -1), ("):", 0)], [0, 1], "\n"),  # one branch, all accepted
    ([], [], "# done"),  # budget=auto chose a plain step (0 nodes)
]
TREE_VOCAB = list(dict.fromkeys(t for nodes, _, nxt in TREE_STEPS for t in [*(n for n, _ in nodes), nxt]))


def scripted_tree_events(prompt: str = "Write add(a, b) in Python") -> list:
    """A scripted tree run: Drafted with tree_parents, Verified with accepted_path and tree_depth."""
    tid = TREE_VOCAB.index
    info = ModelInfo(name="scripted", source="tiny-random", arch="llama", precision="float32")
    events: list = [
        RunStarted(
            t=0.0,
            target=info,
            drafter="ngram",
            budget="auto(k_max=16)",
            rollback="trim",
            prompt_text=prompt,
            prompt_ids=[1, 2, 3],
            max_tokens=64,
            config_yaml=CONFIG_YAML,
            tree="dynamic(nodes=16, depth=8, width=4)",
        ),
        PrefillDone(t=0.1, tokens=3, seconds=0.1),
    ]
    t, out_ids, out_text = 0.1, [], ""
    for step, (nodes, path, nxt) in enumerate(TREE_STEPS, start=1):
        ids = [tid(n) for n, _ in nodes]
        parents = [p for _, p in nodes]
        depths: list[int] = []
        for p in parents:
            depths.append(1 if p < 0 else depths[p] + 1)
        leaf = not any(p == path[-1] for p in parents) if path else False
        t += 0.05
        events.append(Drafted(t=t, step=step, k=len(ids), draft_ids=ids, tree_parents=parents, seconds=0.01))
        events.append(
            Verified(
                t=t + 0.02,
                step=step,
                accepted_ids=[ids[i] for i in path],
                rejected_ids=[x for i, x in enumerate(ids) if i not in path],
                recovered_id=None if leaf else tid(nxt),
                bonus_id=tid(nxt) if leaf else None,
                seconds=0.02,
                accepted_path=path,
                tree_depth=max(depths, default=0),
            )
        )
        events.append(
            RolledBack(
                t=t + 0.03,
                step=step,
                strategy="tree-compact",
                target_dropped=len(ids) - len(path),
                draft_dropped=0,
                seconds=0.0,
            )
        )
        texts = [nodes[i][0] for i in path] + [nxt]
        kept = [ids[i] for i in path] + [tid(nxt)]
        t += 0.05
        events.append(
            Emitted(t=t, step=step, token_ids=kept, text="".join(texts), from_draft=len(path), token_texts=texts)
        )
        out_ids += kept
        out_text += "".join(texts)
    collector = StatsCollector()
    for e in events:
        collector.consume(e)
    stats = msgspec.structs.replace(
        collector.stats(), peak_rss_bytes=0, peak_memory_bytes=300 * 2**20
    )  # no live figure
    events.append(RunFinished(t=t + 0.01, stop_reason="max_tokens", token_ids=out_ids, text=out_text, stats=stats))
    return events
