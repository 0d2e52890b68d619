"""Rebuild a Hugging Face fast tokenizer from GGUF tokenizer metadata.

Contract: `build_tokenizer(meta, filename)` takes the parsed GGUF key/values
and returns `(transformers.PreTrainedTokenizerFast, eos_token_ids)`, offline
and without torch (transformers' own GGUF reader imports torch).

Supported: `tokenizer.ggml.model == "gpt2"` (byte-level BPE) with the
pre-tokenizers named in `PRE_TOKENIZERS` (`tokenizer.ggml.pre`). Each one
reproduces the split the vocabulary was trained with, as llama.cpp's
`llama-vocab.cpp` and the models' own `tokenizer.json` define it.
SentencePiece (`"llama"`) and others raise `SpecpipeError`.

Token types (llama.cpp): 3 CONTROL tokens become special tokens (one id,
dropped by `skip_special_tokens`); 4 USER_DEFINED become plain added tokens
(one id, kept when decoding), as in the models' Hugging Face tokenizers.

End of generation: `tokenizer.ggml.eos_token_id`, plus `eot`/`eom` ids when
the file has them, plus any CONTROL token named like an end of turn
(`END_OF_TURN_NAMES`) that the chat template writes. So SmolLM2-Instruct
stops on `<|im_end|>` only, and a base Qwen (eos `<|endoftext|>`) whose
template writes `<|im_end|>` stops on both. llama.cpp stops on every such
named control token whether or not the template uses it; we do not, so a
chat model does not stop on a pretraining separator it never emits in chat.
"""

from __future__ import annotations

from specpipe.errors import SpecpipeError

CONTROL, USER_DEFINED = 3, 4

# Splits from llama.cpp (llama-vocab.cpp) / the models' tokenizer.json.
_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_LLAMA3_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# tokenizer.ggml.pre -> (NFC normalize?, split applied before byte-level, digits one by one?)
PRE_TOKENIZERS = {
    "default": (False, _GPT2_SPLIT, False),
    "gpt-2": (False, _GPT2_SPLIT, False),
    # SmolLM2's tokenizer.json: Digits(individual) then ByteLevel's GPT-2 regex.
    "smollm": (False, _GPT2_SPLIT, True),
    "starcoder": (False, _GPT2_SPLIT, True),
    "qwen2": (True, _QWEN2_SPLIT, False),
    "deepseek-r1-qwen": (True, _QWEN2_SPLIT, False),
    "llama-bpe": (False, _LLAMA3_SPLIT, False),
}

END_OF_TURN_NAMES = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
)


def build_tokenizer(meta: dict, filename: str = "GGUF"):
    """Build the tokenizer a GGUF file describes.

    Args:
        meta: the file's key/values (`tokenizer.ggml.*`, `tokenizer.chat_template`).
        filename: used in error messages only.

    Returns:
        `(tokenizer, eos_token_ids)`: a `PreTrainedTokenizerFast` with bos/eos/
        unk/pad, special tokens and chat template set, and the ids that end
        generation (see the module docstring).

    Raises:
        SpecpipeError: no tokenizer in the file, or a model/pre-tokenizer type
            that is not supported.
    """
    model = meta.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise SpecpipeError(
            f"{filename}: tokenizer model {model!r} is not supported (only byte-level BPE 'gpt2'); "
            "use a GGUF whose tokenizer.ggml.model is gpt2, e.g. SmolLM2 or Qwen2.5"
        )
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise SpecpipeError(
            f"{filename}: pre-tokenizer {pre!r} is not supported; supported: {', '.join(PRE_TOKENIZERS)}"
        )
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = meta.get("tokenizer.ggml.merges") or []
    backend = _backend(
        tokens,
        types,
        merges,
        pre,
        bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        meta.get("tokenizer.ggml.bos_token_id"),
    )
    # An added token missing from the vocab would get a fresh id past the embedding table.
    if max(backend.get_vocab(with_added_tokens=True).values()) >= len(tokens):
        raise SpecpipeError(
            f"{filename}: special tokens missing from the vocabulary; the file's tokenizer is inconsistent"
        )

    from transformers import PreTrainedTokenizerFast

    def tok(key):
        i = meta.get(f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    template = meta.get("tokenizer.chat_template")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=tok("bos_token_id"),
        eos_token=tok("eos_token_id"),
        unk_token=tok("unknown_token_id"),
        pad_token=tok("padding_token_id") or tok("eos_token_id"),
        chat_template=template,
        clean_up_tokenization_spaces=False,
    )
    return tokenizer, _eos_ids(meta, tokens, types, template)


def _backend(tokens, types, merges, pre, add_bos, bos_id):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    char_of = _byte_chars()
    alphabet = set(char_of.values())
    vocab: dict[str, int] = {}
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty not in (CONTROL, USER_DEFINED) and not set(t) <= alphabet:
            # A normal token stored as plain text: spell it in the byte alphabet BPE works in.
            t = "".join(char_of[b] for b in t.encode("utf-8"))
        vocab.setdefault(t, i)  # keep the first id of a duplicated string
    bpe = models.BPE(
        vocab=vocab,
        merges=[tuple(m.split(" ", 1)) for m in merges],
        dropout=None,
        continuing_subword_prefix="",
        end_of_word_suffix="",
        fuse_unk=False,
        byte_fallback=False,
    )
    tk = Tokenizer(bpe)
    nfc, split, digits = PRE_TOKENIZERS[pre]
    if nfc:
        tk.normalizer = normalizers.NFC()
    steps: list = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps += [
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    tk.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tk.decoder = decoders.ByteLevel()
    # Added tokens are matched in the raw text before pre-tokenization, so they stay one id.
    tk.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
    )
    tk.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    )
    if add_bos and bos_id is not None:
        bos = tokens[bos_id]
        tk.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 $B:1", special_tokens=[(bos, bos_id)]
        )
    else:
        tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk


def _eos_ids(meta: dict, tokens: list[str], types: list[int], template: str | None) -> list[int]:
    ids = [meta.get(f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id", "eom_token_id")]
    if template:
        ids += [
            i
            for i, (t, ty) in enumerate(zip(tokens, types))
            if ty == CONTROL and t in END_OF_TURN_NAMES and t in template
        ]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def _byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in character for each byte (byte -> char)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)  # 188 printable bytes map to themselves
    return {b: chr(c) for b, c in zip(bs, cs)}
