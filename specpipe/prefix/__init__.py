"""The prefix store (store.py): a request's longest stored prefix reused instead of prefilled."""

from specpipe.prefix.store import Hit, PrefixStore, StoreStats

__all__ = ["Hit", "PrefixStore", "StoreStats"]
