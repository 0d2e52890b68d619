"""Import layering: each part of specpipe imports only parts at its layer or below (docs/architecture.md).

Layers, lowest first: leaf utilities (errors, stop signals, run folders, YAML and size checks); the engine (MLX
only); the event vocabulary and the statistics built from it; the decoding parts (core/, the plug-in packages,
costmodel/, batch/, the config schemas and checks); the run (session, runner); the consumers (cli/, bench/,
serve/, tune/, train/, tui/). Checked in the source (every `import`, lazy ones included), so a new upward import
fails here with the line that makes it; the few upward imports that exist are named below with their reason.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "specpipe").rglob("*.py")) + sorted((ROOT / "tui").rglob("*.py"))

LAYERS = {
    "errors": 0,
    "conf": 0,  # the packaged YAML: data
    "run.signals": 0,
    "run.run_folder": 0,
    "config.yaml_data": 0,
    "config.size_bounds": 0,
    "engine": 1,
    "events": 2,
    "metrics": 2,
    **dict.fromkeys(["core", "trees", "drafters", "budgets", "rollbacks", "costmodel", "batch", "prefix"], 3),
    **dict.fromkeys(["plugins", "advice", "config"], 3),
    **dict.fromkeys(["run"], 4),
    **dict.fromkeys(["cli", "bench", "serve", "tune", "train", "tui"], 5),
}
# module -> the higher layer it reaches, and why that is not a cycle in practice (each is a lazy import)
UPWARD = {
    ("specpipe/config/schema.py", "cli"): "the `--help` text a resolver prints, imported when asked",
    ("specpipe/batch/decoder.py", "run"): "a served row builds its plug-ins with the session's own builders",
    ("specpipe/costmodel/check.py", "run"): "specpipe-calibrate's measured check runs two sessions",
}


def unit(module: str) -> str | None:
    """The layered part a dotted module name belongs to: `specpipe.core.step` -> core, `specpipe.run.signals`
    -> run.signals (config/ and run/ are split where a leaf module sits below its package), tui -> tui."""
    parts = module.split(".")
    if parts[0] == "tui":
        return "tui"
    if parts[0] != "specpipe" or len(parts) < 2:
        return None
    two = ".".join(parts[1:3])
    return two if two in LAYERS else parts[1]


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = (
                [f"{node.module}.{a.name}" for a in node.names]
                if node.module in ("specpipe", "specpipe.run", "specpipe.config")
                else [node.module]
            )
            found += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return found


def own_unit(path: Path) -> str | None:
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return unit(module.removesuffix(".__init__"))


def test_every_part_has_a_layer():
    parts = {own_unit(p) for p in SOURCES} - {None, "__init__"}
    assert parts <= set(LAYERS), parts - set(LAYERS)


def test_no_part_imports_a_higher_layer():
    found = []
    for path in SOURCES:
        mine = own_unit(path)
        if mine not in LAYERS:
            continue
        for line, module in imports(path):
            theirs = unit(module)
            if theirs in LAYERS and LAYERS[theirs] > LAYERS[mine]:
                rel = str(path.relative_to(ROOT))
                if (rel, theirs.split(".")[0]) not in UPWARD:
                    found.append(
                        f"{rel}:{line}: {mine} (layer {LAYERS[mine]}) imports {module} (layer {LAYERS[theirs]})"
                    )
    assert not found, "\n".join(found)


def test_the_engine_imports_nothing_of_specpipe_above_it():
    found = [
        f"{p.relative_to(ROOT)}:{line}: {m}"
        for p in sorted((ROOT / "specpipe" / "engine").rglob("*.py"))
        for line, m in imports(p)
        if unit(m) not in (None, "engine", "errors", "run.run_folder")
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("module", ["tui.app", "specpipe.config.schema", "specpipe.events"])
def test_consumers_and_the_config_import_no_mlx(module):
    """The chat's app reaches a run through events and RunControl, the schemas are data: neither loads MLX."""
    code = f"import sys, {module}; sys.exit('mlx.core' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0, module
