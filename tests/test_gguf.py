"""`specpipe.engine.load.gguf.read_gguf` against references that do not use it.

* Weights/architecture: a float64 numpy forward pass that reads the GGUF
  itself with `gguf.GGUFReader` + `gguf.quants.dequantize` and applies RoPE
  the way llama.cpp does on the rows *as stored* (GGML NORMAL mode, adjacent
  pairs, for `llama`; NEOX, halves, for `qwen2`). The loader instead
  un-permutes llama's Q/K rows and runs mlx-lm's rotate-half RoPE, so a
  wrong permutation shows up as different logits (checked explicitly).
* Tokenizer: transformers' own GGUF tokenizer converter (which needs no
  torch once it is handed the metadata) and known SmolLM2 behaviour.

Tiny llama/qwen2 GGUFs written here with `gguf.GGUFWriter` cover both tensor
routes (mx.load triplets; gguf-package dequantization for Q5_0/K-quants),
tied and untied heads, biases, F16, and user-defined tokens.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from specpipe.engine.load import gguf as gguf_loader
from specpipe.engine.load.build import apply_precision, build_model
from specpipe.engine.load.gguf import read_gguf
from specpipe.errors import SpecpipeError

# mlx float32 vs numpy float64 on bit-identical dequantized weights (see
# mlx_logits): what differs is float32 rounding accumulated over the layers.
# Measured max |diff|: 3e-6 / 4e-5 on the tiny llama / qwen2, 1.1e-4 on
# SmolLM2 (30 layers, logits up to 33), 4.4e-4 on Qwen2.5-Coder-0.5B (24
# layers, hidden 896): 4-20x inside ATOL. A wrong Q/K permutation moves
# logits by 1.9 (tiny) / 11.6 (SmolLM2), ~1000x outside.
ATOL, RTOL = 2e-3, 1e-3
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXTS = [
    "Hello world, this is a test.",
    "def add(a, b):\n    return a + b\n\n\n",
    "  spaces   and\ttabs, café naïve 日本語 🙂",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<tool_call>x",
]


# ---------------------------------------------------------------- fixtures


# `smollm2_gguf` (a Path to the cached SmolLM2 Q4_1 GGUF) comes from conftest.py.
@pytest.fixture(scope="module")
def smollm2_ckpt(smollm2_gguf):
    return read_gguf(smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2_reader(smollm2_gguf):
    return gguf.GGUFReader(smollm2_gguf)  # ~5 s to parse the vocabulary: share it


@pytest.fixture(scope="module")
def tiny_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_gguf")
    paths = {arch: write_tiny(root / f"tiny-{arch}.gguf", arch) for arch in ("llama", "qwen2")}
    paths["qwen2-kquants"] = write_tiny(root / "tiny-qwen2-kquants.gguf", "qwen2", kquants_only=True)
    return paths


# ---------------------------------------------------------- numpy reference


class NumpyReference:
    """llama/qwen2 forward in float64 from the raw GGUF, llama.cpp's RoPE layout."""

    def __init__(self, reader: gguf.GGUFReader):
        self.tensors = {t.name: t for t in reader.tensors}
        f = {k: v.contents() for k, v in reader.fields.items() if not k.startswith("tokenizer.")}
        self.arch = a = f["general.architecture"]
        self.n_layer = f[f"{a}.block_count"]
        self.n_head = f[f"{a}.attention.head_count"]
        self.n_kv = f.get(f"{a}.attention.head_count_kv", self.n_head)
        self.eps = f[f"{a}.attention.layer_norm_rms_epsilon"]
        self.base = f.get(f"{a}.rope.freq_base", 10000.0)

    def w(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        shape = tuple(reversed([int(d) for d in t.shape]))  # GGUF ne is fastest-first
        if t.tensor_type in (Q.F32, Q.F16):
            return np.asarray(t.data, np.float64).reshape(shape)
        return gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)

    def linear(self, x, name):
        y = x @ self.w(name + ".weight").T
        return y + self.w(name + ".bias") if name + ".bias" in self.tensors else y

    def rms(self, x, name):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + self.eps) * self.w(name)

    def rope(self, x, pos):
        hd = x.shape[-1]
        ang = pos[:, None] * self.base ** (-np.arange(0, hd, 2) / hd)[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        # NEOX rotates (x[i], x[i + hd/2]); GGML NORMAL rotates (x[2i], x[2i+1]).
        idx0, idx1 = (
            (slice(0, hd // 2), slice(hd // 2, hd)) if self.arch == "qwen2" else (slice(0, hd, 2), slice(1, hd, 2))
        )
        out = np.empty_like(x)
        out[..., idx0] = x[..., idx0] * cos - x[..., idx1] * sin
        out[..., idx1] = x[..., idx0] * sin + x[..., idx1] * cos
        return out

    def logits(self, ids: list[int]) -> np.ndarray:
        emb = self.w("token_embd.weight")
        x = emb[ids]
        T, pos = len(ids), np.arange(len(ids), dtype=np.float64)
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.rms(x, p + "attn_norm.weight")
            q = self.rope(self.linear(h, p + "attn_q").reshape(T, self.n_head, -1), pos)
            k = self.rope(self.linear(h, p + "attn_k").reshape(T, self.n_kv, -1), pos)
            v = self.linear(h, p + "attn_v").reshape(T, self.n_kv, -1)
            rep = self.n_head // self.n_kv  # GQA: query head j reads kv head j // rep
            k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / np.sqrt(q.shape[-1]) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            att = np.einsum("hts,shd->thd", s, v).reshape(T, -1)
            x = x + self.linear(att, p + "attn_output")
            h = self.rms(x, p + "ffn_norm.weight")
            g = self.linear(h, p + "ffn_gate")
            x = x + self.linear(g / (1 + np.exp(-g)) * self.linear(h, p + "ffn_up"), p + "ffn_down")
        x = self.rms(x, "output_norm.weight")
        head = "output.weight" if "output.weight" in self.tensors else "token_embd.weight"
        return x @ self.w(head).T


def mlx_logits(ckpt, ids: list[int]) -> np.ndarray:
    from mlx_lm.models.cache import make_prompt_cache

    # mx.dequantize returns the scales' dtype: with GGUF's float16 scales the
    # dequantized weights would be rounded to float16 (errors up to ~2e-3 on
    # SmolLM2's embedding). Upcast first; then they equal gguf's dequantize
    # bit for bit and only arithmetic differs.
    weights = {k: v.astype(mx.float32) if k.endswith((".scales", ".biases")) else v for k, v in ckpt.weights.items()}
    model = apply_precision(build_model(ckpt.config, weights, ckpt.quantization), "float32")
    out = model(mx.array([ids]), cache=make_prompt_cache(model))
    return np.array(out[0].astype(mx.float32))


def assert_matches_reference(path_or_reader, ckpt, ids: list[int]) -> float:
    ref = NumpyReference(_reader(path_or_reader)).logits(ids)
    got = mlx_logits(ckpt, ids)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)
    assert (got.argmax(-1) == ref.argmax(-1)).all()
    return float(np.abs(got - ref).max())


def hf_reference_tokenizer(path_or_reader):
    """transformers' GGUF tokenizer converter, fed metadata read by GGUFReader."""
    mapping = pytest.importorskip("transformers.integrations.gguf.gguf_tokenizer_mapping")
    f = _reader(path_or_reader).fields
    d = {
        "tokenizer_type": f["tokenizer.ggml.model"].contents(),
        "pre_tokenizer_type": f["tokenizer.ggml.pre"].contents(),
        "tokens": f["tokenizer.ggml.tokens"].contents(),
        "token_type": f["tokenizer.ggml.token_type"].contents(),
        "merges": f["tokenizer.ggml.merges"].contents(),
    }
    backend, _ = mapping.convert_gguf_tokenizer(f["general.architecture"].contents(), d)
    return backend


def _reader(path_or_reader) -> gguf.GGUFReader:
    return path_or_reader if isinstance(path_or_reader, gguf.GGUFReader) else gguf.GGUFReader(path_or_reader)


# -------------------------------------------------------- tiny GGUF writer


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """A ~400-token byte-level BPE trained here, ChatML specials, one user-defined token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(TEXTS * 20 + ["the quick brown fox jumps over the lazy dog " * 5], trainer)
    vocab = tk.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tk.to_str())["model"]["merges"]]
    types = [3 if t in specials else 1 for t in tokens]
    return tokens + ["<tool_call>"], types + [4], merges


def _crafted_kquant(rows: int, cols: int, qtype, rng) -> np.ndarray:
    """Random K-quant blocks with sane f16 scales (gguf cannot quantize K-types)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    if qtype == Q.Q6_K:  # ql[128] qh[64] scales[16] (int8) d(f16)
        raw[..., 192:208] = rng.integers(-12, 13, raw[..., 192:208].shape).astype(np.int8).view(np.uint8)
        raw[..., 208:210] = np.full(raw.shape[:-1], 2e-4, np.float16)[..., None].view(np.uint8)
    else:  # Q4_K: d(f16) dmin(f16) scales[12] qs[128]
        raw[..., 0:2] = np.full(raw.shape[:-1], 4e-3, np.float16)[..., None].view(np.uint8)
        raw[..., 2:4] = np.full(raw.shape[:-1], 2e-3, np.float16)[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def write_tiny(path: Path, arch: str, tokenizer_model: str = "gpt2", seed: int = 0, kquants_only=False) -> Path:
    """2-layer, hidden-256, GQA 4/2 model with mixed tensor types.

    llama: every type mx.load reads (Q4_0/Q4_1/Q8_0/F16/F32), untied head.
    qwen2: Q5_0 and K-quants (forces the dequantize route), q/k/v biases, tied head.
    kquants_only (qwen2): Q4_K instead of Q5_0 -- a file mx.load accepts but
    decodes wrongly (Q4_K), so the loader must not hand it to mx.load.
    """
    rng = np.random.default_rng(seed)
    hidden, ffn, n_head, n_kv, hd, layers = 256, 512, 4, 2, 64, 2
    tokens, types, merges = tiny_vocab()
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(layers)
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(hd)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    w.add_add_bos_token(arch == "llama")
    w.add_chat_template(CHATML)

    def put(name, shape, qtype, scale=None):
        rows, cols = shape
        if qtype in (Q.Q4_K, Q.Q6_K):
            w.add_tensor(name, _crafted_kquant(rows, cols, qtype, rng), raw_dtype=qtype)
            return
        arr = (rng.standard_normal(shape) * (scale or cols**-0.5)).astype(np.float32)
        if qtype == Q.F32:
            w.add_tensor(name, arr)
        elif qtype == Q.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)

    def norm(name, n):
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    lq = arch == "llama"
    put("token_embd.weight", (len(tokens), hidden), Q.Q8_0 if lq else Q.F16, scale=1.0)
    for i in range(layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", hidden)
        norm(p + "ffn_norm.weight", hidden)
        put(p + "attn_q.weight", (n_head * hd, hidden), Q.Q4_0 if lq else Q.Q4_K if kquants_only else Q.Q5_0)
        put(p + "attn_k.weight", (n_kv * hd, hidden), Q.Q4_1 if lq else Q.Q8_0)
        put(p + "attn_v.weight", (n_kv * hd, hidden), Q.Q8_0 if lq else Q.F32)
        put(p + "attn_output.weight", (hidden, n_head * hd), Q.F16 if lq else Q.Q4_K)
        put(p + "ffn_gate.weight", (ffn, hidden), Q.Q6_K if kquants_only else Q.Q4_0)
        put(p + "ffn_up.weight", (ffn, hidden), Q.Q8_0 if lq else Q.F16)
        put(p + "ffn_down.weight", (hidden, ffn), Q.F32 if lq else Q.Q6_K)
        if not lq:
            for proj, n in (("attn_q", n_head), ("attn_k", n_kv), ("attn_v", n_kv)):
                w.add_tensor(p + proj + ".bias", (0.5 * rng.standard_normal(n * hd)).astype(np.float32))
    norm("output_norm.weight", hidden)
    if lq:
        put("output.weight", (len(tokens), hidden), Q.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --------------------------------------------------------------- the tests

IDS_TINY = [1, 40, 7, 300, 123, 5, 350, 60, 61, 250, 2, 17]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen2-kquants"])
def test_tiny_matches_numpy_reference(tiny_paths, arch):
    ckpt = read_gguf(tiny_paths[arch])
    assert ckpt.config["model_type"] == arch.split("-")[0]
    assert ckpt.config["tie_word_embeddings"] is (arch != "llama")
    if arch == "llama":  # every tensor read natively, quantized ones kept as triplets
        assert ckpt.metadata["tensor_route"] == "mx.load"
        assert ckpt.quantization["model.layers.0.self_attn.q_proj"] == {"group_size": 32, "bits": 4}
        assert ckpt.quantization["model.embed_tokens"]["bits"] == 8 and "lm_head.weight" in ckpt.weights
    else:  # Q5_0/K-quants: not for mx.load, everything dequantized to float32
        assert ckpt.metadata["tensor_route"] == "gguf-dequantized-float32"
        assert ckpt.quantization == {} and "lm_head.weight" not in ckpt.weights
        assert ckpt.weights["model.layers.1.mlp.down_proj.weight"].shape == (256, 512)
        assert ckpt.weights["model.layers.0.self_attn.k_proj.bias"].shape == (128,)
    assert_matches_reference(tiny_paths[arch], ckpt, IDS_TINY)


def test_tiny_llama_fails_without_unpermute(tiny_paths, monkeypatch):
    """The reference really checks the Q/K permutation: skipping it is caught."""
    monkeypatch.setattr(gguf_loader, "_unpermute_qk", lambda weights, config: None)
    with pytest.raises(AssertionError):
        assert_matches_reference(tiny_paths["llama"], read_gguf(tiny_paths["llama"]), IDS_TINY)


def test_smollm2_matches_numpy_reference(smollm2_reader, smollm2_ckpt):
    smollm2 = smollm2_ckpt
    assert smollm2.config["model_type"] == "llama" and smollm2.config["num_hidden_layers"] == 30
    assert smollm2.config["tie_word_embeddings"] and "lm_head.weight" not in smollm2.weights
    assert smollm2.quantization["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    assert smollm2.quantization["model.layers.0.mlp.down_proj"] == {"group_size": 32, "bits": 4}
    ids = smollm2.tokenizer.encode("<|im_start|>user\nThe capital of France is Paris, of course.<|im_end|>")[:12]
    assert len(ids) == 12
    assert_matches_reference(smollm2_reader, smollm2, ids)


def test_smollm2_tokenizer(smollm2_reader, smollm2_ckpt):
    smollm2 = smollm2_ckpt
    tk = smollm2.tokenizer
    ids = tk.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == tk.convert_tokens_to_ids("<|im_start|>") == 1
    assert ids[-1] == tk.convert_tokens_to_ids("<|im_end|>") == 2
    assert tk.decode(ids) == "<|im_start|>user\nHi<|im_end|>"
    assert tk.decode(ids, skip_special_tokens=True) == "user\nHi"
    assert (tk.bos_token, tk.eos_token, tk.unk_token) == ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    assert smollm2.eos_token_ids == [2]
    assert len(tk.encode("2024")) == 4  # SmolLM2 splits digits one by one
    hf = hf_reference_tokenizer(smollm2_reader)
    for text in TEXTS:
        ids = tk.encode(text)
        assert tk.decode(ids) == text
        # transformers has no "smollm" split (it uses GPT-2's), identical on digit-free text.
        assert ids == hf.encode(text).ids
    chat = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]
    rendered = tk.apply_chat_template(chat, tokenize=False)
    assert "<|im_start|>user\nWhat is 2+2?<|im_end|>" in rendered
    ids = tk.encode(rendered)
    assert tk.decode(ids) == rendered and ids.count(1) == 3  # system prompt + 2 turns


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_tokenizer(tiny_paths, arch):
    ckpt = read_gguf(tiny_paths[arch])
    tk, hf = ckpt.tokenizer, hf_reference_tokenizer(tiny_paths[arch])
    for text in TEXTS:
        ids = tk.encode(text, add_special_tokens=False)
        assert tk.decode(ids) == text
        if arch == "qwen2":  # same split regex in both; smollm differs from transformers on digits
            assert ids == hf.encode(text).ids
    assert tk.encode("<tool_call>", add_special_tokens=False) == [len(tk) - 1]  # user-defined: one id
    assert tk.decode(tk.encode("a<tool_call>"), skip_special_tokens=True).endswith("<tool_call>")
    assert (tk.encode("hi")[0] == 1) is (arch == "llama")  # add_bos_token respected
    assert ckpt.eos_token_ids == [0, 2]  # eos <|endoftext|> + the template's <|im_end|>
    prompt = tk.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_errors_are_one_line(tmp_path):
    cases = {}
    with pytest.raises(SpecpipeError) as e:
        read_gguf(tmp_path / "missing.gguf")
    cases["missing"] = str(e.value)
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(SpecpipeError, match="not a GGUF") as e:
        read_gguf(tmp_path / "model.safetensors")
    cases["not gguf"] = str(e.value)
    (tmp_path / "cut.gguf").write_bytes(b"GGUF\x03\x00\x00\x00\x05")
    with pytest.raises(SpecpipeError, match="truncated or corrupt") as e:
        read_gguf(tmp_path / "cut.gguf")
    cases["truncated"] = str(e.value)
    w = gguf.GGUFWriter(str(tmp_path / "phi.gguf"), "phi3")
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(SpecpipeError, match="llama, qwen2") as e:
        read_gguf(tmp_path / "phi.gguf")
    cases["arch"] = str(e.value)
    with pytest.raises(SpecpipeError, match="tokenizer model 'llama'") as e:
        read_gguf(write_tiny(tmp_path / "spm.gguf", "llama", tokenizer_model="llama"))
    cases["tokenizer"] = str(e.value)
    for what, msg in cases.items():
        assert "\n" not in msg and msg, what


@pytest.mark.real_models
@pytest.mark.slow
def test_real_qwen_gguf_matches_numpy_reference():
    path = os.environ.get("SPECPIPE_QWEN_GGUF")
    if not path:
        pytest.skip("set SPECPIPE_QWEN_GGUF to a Qwen2.5 GGUF")
    ckpt = read_gguf(path)
    assert ckpt.config["model_type"] == "qwen2"
    tk = ckpt.tokenizer
    ids = tk.encode("<|im_start|>user\ndef fib(n): return 42<|im_end|>")[:8]
    assert ids[0] == tk.convert_tokens_to_ids("<|im_start|>")
    assert tk.convert_tokens_to_ids("<|im_end|>") in ckpt.eos_token_ids
    reader = gguf.GGUFReader(path)
    hf = hf_reference_tokenizer(reader)
    for text in TEXTS:
        assert tk.encode(text) == hf.encode(text).ids and tk.decode(tk.encode(text)) == text
    assert_matches_reference(reader, ckpt, ids)
