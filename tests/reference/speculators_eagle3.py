# Test-only reference for the speculators EAGLE-3 format (vllm-project/speculators, Apache License 2.0).
# Part 1, lines 1-10 and 14-133 of src/speculators/models/eagle3/model_definitions.py verbatim, at commit
# c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b (= the speculators 0.9.0 wheel on PyPI): the EAGLE-3 first layer as
# speculators builds it on transformers' own LlamaDecoderLayer / Qwen3DecoderLayer. Left out: line 11's import of
# speculators.models.base_components and the model_classes table (rebuilt below from the same transformers classes).
# Part 2, `Eagle3Reference`: src/speculators/models/eagle3/core.py's Eagle3DraftModel.__init__ and forward
# transcribed (the package itself cannot be installed without GPU wheels: its dependencies pull a CUDA torch,
# torchaudio, datasets), eager attention with core.py's dense masks (attention.py's create_combined_mask_mod and
# extend_dense_mask_for_draft_tokens), returning every test-time-training step's logits instead of the loss.
# Used only by tests/test_eagle3_parity.py.
from typing import Any

import torch
from transformers import Cache, LlamaConfig, PretrainedConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm
from transformers.models.qwen3.configuration_qwen3 import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RMSNorm
from transformers.processing_utils import Unpack
from transformers.utils.generic import TransformersKwargs

class Eagle3FirstLayerMixin:
    """Shared Eagle3 first-layer modifications for any decoder layer.

    Patches q/k/v projections to accept 2x hidden_size input (cat([embeds, hidden]))
    and overrides forward to split, normalize, and recombine before attention.
    """

    # Provided by the decoder layer base class
    self_attn: Any
    input_layernorm: Any
    post_attention_layernorm: Any
    mlp: Any
    norm_before_residual: bool
    hidden_norm: Any

    def _patch_eagle3_projections(
        self,
        config: PretrainedConfig,
        norm_class: type[torch.nn.Module],
        norm_before_residual: bool,
    ):
        """Replace q/k/v projections with 2x hidden_size input and add hidden_norm."""
        self.norm_before_residual = norm_before_residual
        self.hidden_norm = norm_class(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn.q_proj = torch.nn.Linear(
            2 * config.hidden_size,  # previous: config.hidden_size
            config.num_attention_heads * config.head_dim,
            bias=config.attention_bias,
        )
        self.self_attn.k_proj = torch.nn.Linear(
            2 * config.hidden_size,  # previous: config.hidden_size
            config.num_key_value_heads * config.head_dim,
            bias=config.attention_bias,
        )
        self.self_attn.v_proj = torch.nn.Linear(
            2 * config.hidden_size,  # previous: config.hidden_size
            config.num_key_value_heads * config.head_dim,
            bias=config.attention_bias,
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = False,
        cache_position: torch.LongTensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],  # type: ignore[valid-type]
    ) -> torch.Tensor:
        # Previously in the parent DecoderLayer:
        #   residual = hidden_states
        #   hidden_states = self.input_layernorm(hidden_states)

        # ##### Start of Eagle3 modifications #####

        # hidden_states are cat([embeds, hidden], dim=-1)
        # so residual should be hidden part only, and embeds should be normalized
        mid = hidden_states.shape[2] // 2
        embeds, hidden = hidden_states.split(mid, dim=-1)
        residual = hidden

        # Apply norms
        embeds = self.input_layernorm(embeds)
        hidden = self.hidden_norm(hidden)
        if self.norm_before_residual:
            residual = hidden  # set residual to normalized hidden
        hidden_states = torch.cat([embeds, hidden], dim=-1)
        if torch.__version__ >= "2.10":
            # As of `torch==2.10`, compile attempts to fuse together too many
            # ops, resulting in a fused kernel that exceeds shared memory limits
            # For now, we force a graph break to prevent this
            # https://github.com/pytorch/pytorch/issues/175250
            torch._dynamo.graph_break()  # noqa: SLF001

        # ##### End of Eagle3 modifications #####

        # Self Attention
        hidden_states, _ = self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            cache_position=cache_position,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = residual + hidden_states

        # Fully Connected
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = residual + hidden_states
        return hidden_states  # noqa: RET504


class LlamaDecoderEagle3FirstLayer(Eagle3FirstLayerMixin, LlamaDecoderLayer):  # type:ignore[misc]
    def __init__(
        self,
        config: LlamaConfig,
        layer_idx: int,
        norm_before_residual: bool = False,
    ):
        super().__init__(config, layer_idx)
        self._patch_eagle3_projections(config, LlamaRMSNorm, norm_before_residual)


class Qwen3DecoderEagle3FirstLayer(Eagle3FirstLayerMixin, Qwen3DecoderLayer):  # type:ignore[misc]
    def __init__(
        self,
        config: Qwen3Config,
        layer_idx: int,
        norm_before_residual: bool = False,
    ):
        super().__init__(config, layer_idx)
        self._patch_eagle3_projections(config, Qwen3RMSNorm, norm_before_residual)



# ---------------------------------------------------------------- part 2 (transcribed from core.py)

import copy  # noqa: E402

from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding  # noqa: E402

model_classes = {
    "llama": (LlamaDecoderEagle3FirstLayer, LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding),
    "qwen3": (Qwen3DecoderEagle3FirstLayer, Qwen3DecoderLayer, Qwen3RMSNorm, Qwen3RotaryEmbedding),
}


class Eagle3Reference(torch.nn.Module):
    """core.py's Eagle3DraftModel without the training harness: the same modules, the same forward."""

    def __init__(self, tl_config, draft_vocab_size, norm_before_residual=False, norm_before_fc=False,
                 fc_norm=False, norm_output=False, num_aux=3, target_hidden_size=None):
        super().__init__()
        tl_config._attn_implementation = "eager"
        first, decoder, norm_class, rotary = model_classes[tl_config.model_type]
        self.hidden_size = tl_config.hidden_size
        th = target_hidden_size or self.hidden_size
        self.norm_output = norm_output
        self.embed_tokens = torch.nn.Embedding(tl_config.vocab_size, self.hidden_size)
        self.fc = torch.nn.Linear(num_aux * th, self.hidden_size, bias=False)
        layers = [first(tl_config, layer_idx=0, norm_before_residual=norm_before_residual)]
        layers.extend(decoder(tl_config, i) for i in range(1, tl_config.num_hidden_layers))
        self.layers = torch.nn.ModuleList(layers)
        modified = copy.copy(tl_config)
        modified.hidden_size *= 2
        self.rotary_emb = rotary(modified)
        self.norm = norm_class(self.hidden_size, eps=tl_config.rms_norm_eps)
        self.input_norm = norm_class(num_aux * th, eps=tl_config.rms_norm_eps) if norm_before_fc else None
        self.fc_norm = (
            torch.nn.ModuleList(norm_class(th, eps=tl_config.rms_norm_eps) for _ in range(num_aux)) if fc_norm else None
        )
        self.lm_head = torch.nn.Linear(self.hidden_size, draft_vocab_size, bias=False)

    @torch.no_grad()
    def forward(self, hidden_states, input_ids, ttt_steps=1):
        """hidden_states [1, n, num_aux * H], input_ids [1, n] (already shifted: pair i = (g_i, x_{i+1})).

        Returns one [n, draft_vocab] logits tensor per test-time-training step; step j's next inputs are
        core.py's: the teacher-forced ids shifted by 1 + j, the step's output hidden states, positions + 1.
        """
        from transformers import DynamicCache

        n = hidden_states.shape[1]
        position_ids = 1 + torch.arange(n).unsqueeze(0)  # shift_batch: positions start at 1
        past_key_values = DynamicCache()
        q, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
        mask = torch.zeros(n, n).masked_fill_(~(q >= k), float("-inf"))[None, None]
        if self.input_norm is not None:
            hidden_states = self.input_norm(hidden_states)
        if self.fc_norm is not None:
            chunks = hidden_states.chunk(len(self.fc_norm), dim=-1)
            hidden_states = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        hidden_states = self.fc(hidden_states)
        original_input_ids = input_ids.clone()
        out = []
        for ttt_step in range(ttt_steps):
            input_embeds = self.embed_tokens(input_ids)
            cache_position = torch.arange(ttt_step * n, (ttt_step + 1) * n)
            hidden_states = torch.cat([input_embeds, hidden_states], dim=-1)
            position_embeddings = self.rotary_emb(hidden_states, position_ids)
            for decoder_layer in self.layers:
                hidden_states = decoder_layer(
                    hidden_states,
                    attention_mask=mask,
                    position_ids=position_ids,
                    past_key_values=past_key_values,
                    cache_position=cache_position,
                    position_embeddings=position_embeddings,
                )
            if self.norm_output:
                hidden_states = self.norm(hidden_states)
                logits = self.lm_head(hidden_states)
            else:
                logits = self.lm_head(self.norm(hidden_states))
            out.append(logits[0])
            input_ids = torch.cat(
                [original_input_ids[:, 1 + ttt_step :], original_input_ids.new_zeros(1, 1 + ttt_step)], dim=-1
            )
            diag = torch.zeros(n, n).masked_fill_(~(q == k), float("-inf"))[None, None]
            mask = torch.cat([mask, diag], dim=-1)  # extend_dense_mask_for_draft_tokens
            position_ids = position_ids + 1
        return out
