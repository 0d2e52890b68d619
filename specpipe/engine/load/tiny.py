"""Tiny randomly initialised mlx-lm models with a byte-level tokenizer.

`model=tiny-random model.arch=<mlx-lm model_type>` builds one: small enough
to run in milliseconds, seeded so the same seed gives the same weights, and
with a real tokenizer (256 byte tokens + a few specials) so text round-trips.
Used by tests, demos and checks; never a stand-in for a real model's numbers.
"""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map

from specpipe.engine.load.build import model_classes
from specpipe.errors import SpecpipeError

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 256 + len(SPECIALS)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Shared small dimensions; per-architecture extras below.
_BASE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    rms_norm_eps=1e-5,
    vocab_size=VOCAB_SIZE,
    rope_theta=10000.0,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)

# Gemma-4 text: sliding / full attention in turn (full layers with their own head size and partial RoPE),
# the last 2 layers reading the K/V of the last earlier layer of their kind, logits soft-capped
_GEMMA4_TEXT = dict(
    num_hidden_layers=4,
    global_head_dim=32,
    num_kv_shared_layers=2,
    hidden_size_per_layer_input=0,
    vocab_size_per_layer_input=VOCAB_SIZE,
    sliding_window=64,
    sliding_window_pattern=2,
    final_logit_softcapping=300.0,  # Gemma-4's 30 would saturate these random logits into argmax ties
    # untied (Gemma-4 ties): a tied random model's top logit is its input token's, so it repeats it forever
)

ARCH_EXTRAS: dict[str, dict] = {
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "mistral": {},
    "gemma3_text": dict(query_pre_attn_scalar=16, sliding_window=64, sliding_window_pattern=2),
    # gemma-3-4b/12b/27b checkpoints: the multimodal wrapper (model_type gemma3) around the same text model
    "gemma3": dict(
        text_config=dict(
            _BASE, model_type="gemma3_text", query_pre_attn_scalar=16, sliding_window=64, sliding_window_pattern=2
        )
    ),
    "gemma4_text": _GEMMA4_TEXT,
    # Gemma-4 checkpoints with vision / audio towers: the multimodal wrapper (model_type gemma4) around the same
    # text model (mlx-lm drops the towers; the wrapper's vocab_size reaches the text model)
    "gemma4": dict(text_config=dict(_BASE, model_type="gemma4_text", **_GEMMA4_TEXT)),
    "phi3": {},
    "olmo2": {},
    # llama4 (text): 3 chunked-attention layers (32-position chunks), then a global NoPE one; MoE every 2nd
    "llama4": dict(
        text_config=dict(
            _BASE,
            model_type="llama4_text",
            num_hidden_layers=4,  # the model masks its global layers with layer 3's cache
            attention_bias=False,
            attention_chunk_size=32,
            interleave_moe_layer_step=2,
            intermediate_size_mlp=128,
            num_experts_per_tok=1,  # mlx-lm's llama4 routes to one expert only
            num_local_experts=2,
            rope_scaling=None,
            use_qk_norm=True,
        )
    ),
    # Recurrent and hybrid families (rollback=checkpoint / recompute / auto; trim refuses them).
    "qwen3_next": dict(  # layer 0 Gated DeltaNet, layer 1 attention
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=0,
        num_experts_per_tok=1,
        decoder_sparse_step=1,
        shared_expert_intermediate_size=128,
        mlp_only_layers=[],
        moe_intermediate_size=128,
        partial_rotary_factor=0.5,
        full_attention_interval=2,
    ),
    "qwen3_5": dict(  # same layout; flat config (no text_config) is read as the text model's
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        full_attention_interval=2,
    ),
    "mamba2": dict(
        num_heads=4,
        head_dim=16,
        state_size=16,
        layer_norm_epsilon=1e-5,
        conv_kernel=4,
        n_groups=1,
        use_bias=False,
        use_conv_bias=True,
        time_step_limit=(0.0, float("inf")),
        time_step_rank="auto",
    ),
    "nemotron_h": dict(  # Mamba2, attention, Mamba2, MLP
        attention_bias=False,
        mamba_num_heads=4,
        mamba_head_dim=16,
        mamba_proj_bias=False,
        ssm_state_size=16,
        conv_kernel=4,
        n_groups=1,
        mlp_bias=False,
        layer_norm_epsilon=1e-5,
        use_bias=False,
        use_conv_bias=True,
        hybrid_override_pattern=["M", "*", "M", "-"],
    ),
    "falcon_h1": dict(  # Mamba2 and attention in parallel in every layer
        head_dim=16,
        mamba_d_conv=4,
        mamba_d_head=16,
        mamba_d_ssm=64,
        mamba_d_state=16,
        mamba_n_heads=4,
        mamba_chunk_size=32,
    ),
    "lfm2": dict(  # short gated conv, then attention
        norm_eps=1e-5,
        conv_bias=False,
        conv_L_cache=3,
        block_dim=64,
        block_multiple_of=16,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=False,
        block_ff_dim=128,
        layer_types=["conv", "full_attention"],
    ),
    "mamba": dict(state_size=16, conv_kernel=4, use_bias=False, use_conv_bias=True, time_step_rank=4),
    "recurrent_gemma": dict(  # conv + RG-LRU, then local attention
        attention_bias=False,
        conv1d_width=4,
        logits_soft_cap=30.0,
        attention_window_size=2048,
        block_types=["recurrent", "attention"],
    ),
    "rwkv7": dict(norm_eps=1e-5, a_low_rank_dim=8, v_low_rank_dim=8, gate_low_rank_dim=8, decay_low_rank_dim=8),
}


def tiny_config(arch: str, overrides: dict | None = None) -> dict:
    """The mlx-lm config dict of a tiny `arch` model."""
    config = {"model_type": arch, **_BASE, **ARCH_EXTRAS.get(arch, {}), **(overrides or {})}
    return config


def build_tiny(arch: str, seed: int = 0, overrides: dict | None = None):
    """Build a seeded random float32 model.

    Weights are drawn from N(0, 0.02·√(hidden/…))-like scales by mlx's own
    initialisers, then the embeddings and output layer are widened so logits
    spread out: argmax near-ties (where float rounding could flip a greedy
    token) become rare.

    Returns:
        (model, config)
    """
    config = tiny_config(arch, overrides)
    model_cls, args_cls = model_classes(config)
    mx.random.seed(seed)
    try:
        model = model_cls(args_cls.from_dict(config))
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise SpecpipeError(
            f"cannot build a tiny {arch!r} model ({exc}); pass its required sizes with "
            "+model.tiny.<key>=<value> or choose another model.arch"
        ) from exc
    key = mx.random.key(seed)

    def init(path_value):
        path, value = path_value
        nonlocal key
        if not mx.issubdtype(value.dtype, mx.floating) or value.ndim < 2:
            return value  # norms, biases and scalars keep their defaults
        key, sub = mx.random.split(key)
        scale = 1.0 if "embed" in path or "lm_head" in path else value.shape[-1] ** -0.5
        return mx.random.normal(value.shape, key=sub) * scale

    flat = [(p, init((p, v))) for p, v in tree_flatten(model.parameters())]
    model.load_weights(flat, strict=False)
    model.update(
        tree_map(lambda v: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v, model.parameters())
    )
    model.eval()
    mx.eval(model.parameters())
    if overrides:
        check_sizes(model, arch)
    return model, config


def check_sizes(model, arch: str) -> None:
    """One forward over one token: sizes a user chose (+model.tiny.*) that build but cannot compute (heads
    that do not divide, a zero dimension) fail here as one line instead of mid-run with MLX's traceback."""
    from mlx_lm.models.cache import make_prompt_cache

    try:
        mx.eval(model(mx.array([[1]]), cache=make_prompt_cache(model)))
    except Exception as exc:  # noqa: BLE001  (MLX and mlx-lm raise ValueError, IndexError, ZeroDivisionError ...)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SpecpipeError(
            f"the tiny {arch!r} model's sizes do not compute ({first}); change the +model.tiny.<key> values"
        ) from exc


def byte_tokenizer():
    """A byte-level BPE tokenizer with no merges: every byte is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for special in SPECIALS:
        vocab[special] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS,
    )
    fast.chat_template = CHATML
    return fast
