"""Bytes a decode step reads: what a bandwidth-bound forward costs, before any timing."""

from __future__ import annotations


def weight_bytes(*modules) -> int:
    """Bytes of the parameters of `modules` (what one decode step reads through them)."""
    from mlx.utils import tree_flatten

    return sum(a.nbytes for m in modules for _, a in tree_flatten(m.parameters()))
