"""Screenshot of the Studio's tape browser on the example tape: ``docs/studio-browser.png``.

Runs the analyst team of ``examples/analyst.py`` with its scripted LLM into a temporary store,
serves the Studio on a free local port, opens a step of the search helper (so the panel shows
its exact prompt and a two-level view stack) in Debian's Chromium, and saves the PNG.

Run: ``python scripts/studio_screenshot.py [--out docs/studio-browser.png] [--step 10]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from examples.analyst import ENVIRONMENT, make_analyst, scripted_brain, start_tape  # noqa: E402
from tapekit import FunctionLLM, Prompt, main_loop  # noqa: E402
from tapekit.llm.base import LLMEvent  # noqa: E402
from tapekit.store import SQLiteStore  # noqa: E402
from tapekit.studio import create_app  # noqa: E402
from tapekit.studio.app import serve_in_thread  # noqa: E402

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


class MeteredBrain(FunctionLLM):
    """The example's scripted model, reporting words as tokens and a price like a paid API, so
    that the screenshot shows usage figures."""

    model_name: str = "scripted-brain"
    fn: Any = scripted_brain
    latency_s: float = 0.05
    cost_per_prompt_token: float = 1e-6
    cost_per_output_token: float = 4e-6

    def _astream(self, prompt: Prompt) -> AsyncIterator[LLMEvent]:
        return _metered(super()._astream(prompt), prompt)


async def _metered(events: AsyncIterator[LLMEvent], prompt: Prompt) -> AsyncIterator[LLMEvent]:
    n_prompt = sum(len(str(m.get("content") or "").split()) for m in prompt.messages)
    async for event in events:
        if event.output is not None:
            out = event.output
            n_out = len((out.content or "").split()) + sum(
                len(c.arguments.split()) for c in out.tool_calls or []
            )
            event = event.model_copy(update={"prompt_tokens": n_prompt, "output_tokens": n_out})
        yield event


def main(argv: list[str] | None = None) -> int:
    """Make the screenshot; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "studio-browser.png"))
    parser.add_argument("--step", type=int, default=13, help="the step whose details the panel shows")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp, SQLiteStore(Path(tmp) / "studio.db") as store:
        start = start_tape()
        record = store.recorder(start, tags=["example"])
        for event in main_loop(make_analyst(MeteredBrain()), start, ENVIRONMENT):
            record(event)
        store.flush()
        app = create_app(store, agents={"analyst": lambda: (make_analyst(MeteredBrain()), ENVIRONMENT)})
        with serve_in_thread(app) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 940}, device_scale_factor=1)
            page.goto(f"{url}/tapes/{start.metadata.id}/steps/{args.step}")
            page.wait_for_selector(".step-detail")
            page.screenshot(path=args.out)
            browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
