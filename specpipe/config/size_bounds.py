"""Bounds on the sizes a model or drafter config may give, so a crafted config.json (or `+model.tiny.*` override)
is one line instead of an allocation that exhausts memory or an MLX abort.

Contract: `check_sizes(node, where)` walks a config (nested dicts and lists: `text_config`,
`transformer_layer_config`, `dflash_config`) and returns one line naming `where`, the key, its value and the
allowed range for the first size key in SIZE_BOUNDS that is not an integer inside its range; None when all are.
Keys it does not list pass untouched. It imports nothing and reads values only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

# key -> (lowest, highest) allowed: far above every published model (Llama-3.1-405B: 126 layers, hidden 16384,
# vocab 128256; Gemma-3: vocab 262144), far below what one process can allocate
SIZE_BOUNDS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 1024),
    "num_target_layers": (1, 1024),
    "num_kv_shared_layers": (0, 1024),
    "hidden_size": (1, 1 << 16),
    "backbone_hidden_size": (1, 1 << 16),
    "target_hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 20),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "vocab_size": (1, 1 << 22),
    "draft_vocab_size": (1, 1 << 22),
    "max_position_embeddings": (1, 1 << 24),
    "block_size": (1, 1024),
    "num_centroids": (1, 1 << 20),
    "centroid_intermediate_top_k": (1, 1 << 20),
    "mask_token_id": (0, (1 << 22) - 1),
}


def check_sizes(node: Any, where: str) -> str | None:
    """The first size outside SIZE_BOUNDS under `node`, as one line naming `where` and the key."""
    for key, value in _sized(node, ""):
        lo, hi = SIZE_BOUNDS[key.rsplit(".", 1)[-1]]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            return f"{where}: {key}={value!r} is out of range: allowed an integer {lo}..{hi}"
    return None


def _sized(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        name = f"{path}.{key}" if path else str(key)
        if key in SIZE_BOUNDS:
            yield name, value
        elif isinstance(value, (dict, list)):
            yield from _sized(value, name)
