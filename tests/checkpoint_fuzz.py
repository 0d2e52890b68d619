"""The checkpoint-folder fuzzer's body, run in its own process by tests/test_faults_checkpoint_fuzz.py (a crash
signal there fails the test instead of killing pytest).

Schema-driven: for every drafter layout (EAGLE-3's eagle and speculators layouts, DFlash, a Gemma-4 assistant
with the centroid head) it writes a valid tiny folder, then mutates every key of its config.json (nested ones
too) and every field of its safetensors header, loads each mutant with the layout's own loader, and prints one
JSON line per mutant: {"layout", "mutation", "outcome": "loaded" | "refused" | <exception type>, "message"}.
A refusal must be a SpecpipeError of one line; anything else is a finding.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import time
from pathlib import Path

import dflash_tiny
import eagle3_tiny
import gemma4_tiny

from specpipe.errors import SpecpipeError

# the values each key is set to, in turn (a key's n-th mutation is VALUES[(n + key index) % len]): wrong types,
# zero, negative, huge, and the key removed
VALUES = [0, -1, 2**40, "x", None, 1.5, [], {"a": 1}, True, "REMOVE"]
PER_KEY = 3
HEADER_FIELDS = {
    "dtype": ["X9", 7, None],
    "shape": [[-1], [2**40, 2**40], "x", [1.5]],
    "data_offsets": [[0, 2**40], [-8, 0], [5, 1], "x", [0]],
}


def layouts(root: Path) -> dict:
    """layout name -> (folder, loader)."""
    from specpipe.drafters.dflash.layout import load_head as load_dflash
    from specpipe.drafters.eagle3.layouts import load_head as load_eagle3
    from specpipe.drafters.gemma4_assistant.layout import load_assistant

    head = eagle3_tiny.head_config()
    g4 = gemma4_tiny.config(centroids=7)
    return {
        "eagle3-eagle": (eagle3_tiny.write(root / "e", "eagle", head, eagle3_tiny.random_weights(head)), load_eagle3),
        "eagle3-speculators": (
            eagle3_tiny.write(root / "s", "speculators", head, eagle3_tiny.random_weights(head)),
            load_eagle3,
        ),
        "dflash": (dflash_tiny.write_drafter(root / "d", num_target_layers=4), load_dflash),
        "gemma4-assistant": (gemma4_tiny.write(root / "g", g4, gemma4_tiny.random_weights(g4)), load_assistant),
    }


def key_paths(node, path=()):
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield (*path, key)
        yield from key_paths(value, (*path, key))


def mutated(node, path, value):
    node = json.loads(json.dumps(node))
    *parents, last = path
    holder = node
    for key in parents:
        holder = holder[key]
    if value == "REMOVE":
        del holder[last]
    else:
        holder[last] = value
    return node


def header_mutants(folder: Path):
    """(description, bytes of a safetensors file whose first tensor's header field is spoiled)."""
    data = (folder / "model.safetensors").read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + length])
    first = next(k for k in header if k != "__metadata__")
    for field, values in HEADER_FIELDS.items():
        for value in values:
            spoiled = json.loads(json.dumps(header))
            spoiled[first][field] = value
            text = json.dumps(spoiled).encode()
            yield f"{first}.{field}={value!r}", struct.pack("<Q", len(text)) + text + data[8 + length :]
    yield "cut in half", data[: len(data) // 2]
    yield "header length past the end", struct.pack("<Q", 2**40) + data[8:]


def attempt(loader, folder: Path) -> tuple[str, str]:
    try:
        loader(str(folder))
        return "loaded", ""
    except SpecpipeError as exc:
        return "refused", str(exc)
    except Exception as exc:  # noqa: BLE001  (what the test reports as a finding)
        return type(exc).__name__, str(exc).splitlines()[0] if str(exc) else ""


def main(root: Path, budget_s: float) -> None:
    deadline = time.monotonic() + budget_s
    for name, (folder, loader) in layouts(root).items():
        config = json.loads((folder / "config.json").read_text())
        for index, path in enumerate(key_paths(config)):
            for n in range(PER_KEY):
                if time.monotonic() > deadline:
                    print(json.dumps({"layout": name, "outcome": "out of time"}), flush=True)
                    return
                value = VALUES[(index + n) % len(VALUES)]
                mutant = root / "mutant"
                shutil.rmtree(mutant, ignore_errors=True)
                shutil.copytree(folder, mutant)
                (mutant / "config.json").write_text(json.dumps(mutated(config, path, value)))
                outcome, message = attempt(loader, mutant)
                what = f"config.json {'.'.join(map(str, path))}={value!r}"
                print(json.dumps({"layout": name, "mutation": what, "outcome": outcome, "message": message}))
        for what, data in header_mutants(folder):
            mutant = root / "mutant"
            shutil.rmtree(mutant, ignore_errors=True)
            shutil.copytree(folder, mutant)
            (mutant / "model.safetensors").write_bytes(data)
            outcome, message = attempt(loader, mutant)
            print(
                json.dumps({"layout": name, "mutation": f"safetensors {what}", "outcome": outcome, "message": message})
            )
        sys.stdout.flush()


if __name__ == "__main__":
    main(Path(sys.argv[1]), float(sys.argv[2]))
