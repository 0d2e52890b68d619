"""Token-tree speculation: a tree of draft tokens verified in one target forward (docs/architecture.md)."""
