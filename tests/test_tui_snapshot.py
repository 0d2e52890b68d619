"""Snapshots of the chat UI drawing a scripted transcript: the default (clean)
view, the full view, the plain view and the narrow (80x24) layout with its help.

No model and no clocks: the events (tests/tui_script.py) carry fixed times,
so the stats panel is the same on every run. A diff here is a UI contract
change: review the SVG (`pytest --snapshot-update` to accept it).
"""

from __future__ import annotations

from tui_script import scripted_events

from tui.app import ChatApp
from tui.sources import ReplaySource
from tui.widgets.prompt import PromptArea


async def _settle(pilot) -> None:
    pilot.app.query_one(PromptArea).cursor_blink = False  # a blinking cursor would differ between runs
    await pilot.app.workers.wait_for_complete()
    # The worker's last messages (and the refreshes they schedule) may still be
    # queued on a busy machine: wait until the transcript's last line is drawn.
    for _ in range(100):
        if "#&#160;done" in pilot.app.export_screenshot() and "Quit" in pilot.app.export_screenshot():
            break
        await pilot.pause(0.05)
    else:
        # Still short of the last line: redraw from the same events (the data is
        # complete once the worker ended; a late layout pass is what can lag).
        pilot.app.redraw()
        await pilot.pause(0.1)
    for _ in range(4):
        await pilot.pause(0.05)
    await pilot.wait_for_scheduled_animations()


def _app() -> ChatApp:
    return ChatApp(ReplaySource(scripted_events(), speed=0), title="scripted")


def _after(*keys: str):
    async def run_before(pilot) -> None:
        await _settle(pilot)
        await pilot.press(*keys)
        for _ in range(4):
            await pilot.pause(0.05)

    return run_before


def test_clean_view(snap_compare):
    assert snap_compare(_app(), terminal_size=(100, 30), run_before=_settle)


def test_full_view(snap_compare):
    assert snap_compare(_app(), terminal_size=(100, 30), run_before=_after("ctrl+t"))


def test_plain_view(snap_compare):
    assert snap_compare(_app(), terminal_size=(100, 30), run_before=_after("ctrl+t", "ctrl+t"))


def test_narrow_80x24(snap_compare):
    assert snap_compare(_app(), terminal_size=(80, 24), run_before=_settle)


def test_help_at_80x24(snap_compare):
    assert snap_compare(_app(), terminal_size=(80, 24), run_before=_after("f1"))


def test_tree_full_view(snap_compare):
    """A token-tree run: the step strip shows the branches each step tried (3, 2, then one branch's bar),
    the accepted path is the accepted span, the other branches one struck-through marker."""
    from tui_script import scripted_tree_events

    app = ChatApp(ReplaySource(scripted_tree_events(), speed=0), title="scripted tree")
    assert snap_compare(app, terminal_size=(100, 30), run_before=_after("ctrl+t"))
