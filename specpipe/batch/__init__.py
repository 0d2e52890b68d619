"""Batched speculative decoding: many requests verified by one target forward per step."""
