"""`tree` config group -> a TreeShape: how deep drafters look, how many
alternatives they score per position, and which candidates are verified.

Contract: `TreeShape.from_config(cfg.tree)` checks the values (ConfigError,
exit 2, before anything loads) and returns None for `tree=chain` (the
chain path runs untouched). `select(candidates)` cuts a drafter's scored
candidate tree down to the nodes the target verifies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specpipe.errors import ConfigError
from specpipe.trees.tree import TokenTree, select_dynamic, select_static

MAX_NODES = 64


@dataclass
class TreeShape:
    kind: str  # "static" | "dynamic"
    branching: list[int] = field(default_factory=list)  # static: children per kept node at depth 1, 2, ...
    nodes: int = 16  # dynamic: nodes verified per step
    depth: int = 8  # dynamic: deepest level drafted

    @classmethod
    def from_config(cls, tree) -> TreeShape | None:
        name = tree.name if tree is not None else "chain"  # configs built without the group (older bench nodes)
        if name == "chain":
            return None
        if name == "static":
            branching = [int(b) for b in tree.branching]
            if not branching or min(branching) < 1:
                raise ConfigError(
                    f"tree.branching={branching}: give children per depth, each >= 1, e.g. tree.branching=[4,2,1,1]"
                )
            shape = cls(kind="static", branching=branching)
            if shape.max_nodes() > MAX_NODES:
                raise ConfigError(
                    f"tree.branching={branching} makes {shape.max_nodes()} nodes: at most {MAX_NODES}, "
                    "lower a level's branching"
                )
            return shape
        if name == "dynamic":
            if not 1 <= tree.nodes <= MAX_NODES:
                raise ConfigError(f"tree.nodes={tree.nodes}: must be 1..{MAX_NODES}")
            if not 1 <= tree.depth <= MAX_NODES:
                raise ConfigError(f"tree.depth={tree.depth}: must be 1..{MAX_NODES}")
            return cls(
                kind="dynamic",
                nodes=int(tree.nodes),
                depth=int(tree.depth),
                branching=[int(tree.width)] * int(tree.depth),
            )
        raise ConfigError(f"tree={name}: unknown tree shape; use tree=chain, tree=static or tree=dynamic")

    def label(self) -> str:
        """What RunStarted and reports show: static([4, 2, 1, 1]) or dynamic(nodes=16, depth=8, width=4)."""
        if self.kind == "static":
            return f"static({self.branching})"
        return f"dynamic(nodes={self.nodes}, depth={self.depth}, width={self.width})"

    @property
    def max_depth(self) -> int:
        return len(self.branching) if self.kind == "static" else self.depth

    @property
    def width(self) -> int:
        """Alternatives a model drafter scores per position."""
        return max(self.branching) if self.branching else 1

    def max_nodes(self) -> int:
        total, level = 0, 1
        for b in self.branching:
            level *= b
            total += level
        return total if self.kind == "static" else self.nodes

    def select(self, candidates: TokenTree) -> TokenTree:
        if self.kind == "static":
            return select_static(candidates, self.branching)
        return select_dynamic(candidates, self.nodes)
