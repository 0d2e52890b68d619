"""Write the `longctx` suites from documents the project ships: no downloads.

Each prompt is one document: the project's own README, docs/*.md and then
its Python source, concatenated in a fixed order and cut at a line to a
prompt length measured with SmolLM2's tokenizer (the chat
template included), followed by a question whose answer quotes the
document: "quote the paragraph that begins with ...", for a paragraph early
in the document and one late in it. Sizes: 1k, 4k, 8k tokens in `longctx`
(all fit SmolLM2's 8,192-token context with room to answer), 16k and 32k in
`longctx-32k` (Qwen2.5-Coder: 32,768).

The files are committed; rerun this script only to change the suites:

    python scripts/make_longctx_suite.py          # writes specpipe/bench/suites/longctx.jsonl, longctx-32k.jsonl
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUITES = {"longctx": {"1k": 1024, "4k": 4096, "8k": 7800}, "longctx-32k": {"16k": 16384, "32k": 32000}}
HEAD = "Read the document below, then answer the question.\n\n---\n"
QUESTION = (
    '---\n\nQuestion: quote, word for word, the whole paragraph of the document that begins with "{start}". '
    "Answer with the quoted paragraph only."
)


def sources() -> list[Path]:
    docs = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    code = sorted(p for p in (ROOT / "specpipe").rglob("*.py") if p.name != "__init__.py")
    return docs + code


def lines() -> list[str]:
    out = []
    for path in sources():
        out += ["", f"## {path.relative_to(ROOT)}", ""] + path.read_text(encoding="utf-8").splitlines()
    return out


def quotable(paragraph: str) -> bool:
    """Prose worth quoting: 25+ words, no table, code fence or indented code."""
    first = paragraph.lstrip()[:1]
    return len(paragraph.split()) >= 25 and first not in "|`#>" and not paragraph.startswith(("    ", "def ", "class "))


def build(count_tokens, size: int) -> tuple[str, list[str]]:
    """The longest document of whole lines whose prompt stays within `size` tokens, and its whole paragraphs."""
    every = lines()
    lo, hi = 1, len(every)
    while lo < hi:  # binary search on the line count
        mid = (lo + hi + 1) // 2
        if count_tokens(HEAD + "\n".join(every[:mid]) + "\n" + QUESTION.format(start="x " * 8)) <= size:
            lo = mid
        else:
            hi = mid - 1
    doc = "\n".join(every[:lo]).strip("\n")
    paras = [p.strip("\n") for p in re.split(r"\n\s*\n", doc) if p.strip()]
    return doc, paras[:-1]  # the last one may be cut


def main() -> None:
    from specpipe.engine.load.blas import preload_blas

    preload_blas()
    from specpipe.engine.load.loader import load_engine

    engine = load_engine("smollm2-135m")
    count = lambda text: len(engine.encode_prompt(text, chat=True))  # noqa: E731
    for suite, sizes in SUITES.items():
        rows = []
        for label, size in sizes.items():
            doc, paras = build(count, size)
            candidates = [p for p in paras if quotable(p)]
            for where, pick in (("early", candidates[len(candidates) // 8]), ("late", candidates[-1])):
                start = " ".join(pick.split()[:8])
                prompt = HEAD + doc + "\n" + QUESTION.format(start=start)
                rows.append({"id": f"longctx-{label}-{where}", "prompt": prompt, "answer": pick})
                print(f"{suite}: longctx-{label}-{where}: {count(prompt)} tokens (chat template included)")
            if suite == "longctx-32k":
                rows.pop(-2)  # one question per size (the late one): the file stays small
        path = ROOT / "specpipe" / "bench" / "suites" / f"{suite}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


if __name__ == "__main__":
    main()
