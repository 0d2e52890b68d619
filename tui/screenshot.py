"""Screenshot of the chat after a real answer: `python -m tui.screenshot OUT.svg [overrides]`.

Composes the config as `specpipe-chat` does, sends `prompt.text` as the
first message to a live Session, waits for the answer to finish and writes
the screen as SVG (how docs/tui.svg is made):

    python -m tui.screenshot docs/tui.svg model=smollm2-135m prompt=code-edit max_tokens=160

`--size=COLSxROWS` sets the terminal (default 110x34).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path


async def shoot(cfg, out: Path, size: tuple[int, int], timeout_s: float = 600) -> None:
    from tui.app import ChatApp
    from tui.sources import LiveSource
    from tui.widgets.prompt import PromptArea

    source = LiveSource(cfg)
    app = ChatApp(source, title=f"{cfg.model.name} | draft={cfg.draft.name}", first_message=cfg.prompt.text)
    async with app.run_test(size=size) as pilot:
        app.query_one(PromptArea).cursor_blink = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not (app.control is None and app.figures.stop_reason) and loop.time() < deadline:
            await pilot.pause(0.2)
        for _ in range(10):  # the last batch's redraw and the footer
            await pilot.pause(0.05)
        out.write_text(app.export_screenshot(title="specpipe-chat"))
    source.close()


def main() -> None:
    sizes = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--size=")]
    rest = [a for a in sys.argv[1:] if not a.startswith("--size=")]
    if not rest or rest[0].startswith("-"):
        sys.exit(__doc__)
    out, overrides = Path(rest[0]), rest[1:]
    cols, _, rows = (sizes[-1] if sizes else "110x34").partition("x")
    if not (cols.isdigit() and rows.isdigit()):
        sys.exit(f"--size={sizes[-1]}: give COLSxROWS, e.g. --size=110x34")
    size = (int(cols), int(rows))

    from specpipe.cli.shell import preload_blas

    preload_blas()
    from hydra import compose, initialize_config_module

    import specpipe.config.schema  # noqa: F401  (registers the schemas)

    with initialize_config_module("specpipe.conf", version_base=None):
        cfg = compose("config", overrides=overrides)
    asyncio.run(shoot(cfg, out, size))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
