"""Screenshot of the Studio's tape browser on the example tape: ``docs/studio-browser.png``.

Runs the analyst team of ``tapekit.testing.analyst`` with its scripted LLM into a temporary store,
serves the Studio on a free local port, opens a step of the search helper (so the panel shows
its exact prompt and a two-level view stack) in Debian's Chromium, and saves the PNG.

Run: ``python scripts/studio_screenshot.py [--out docs/studio-browser.png] [--step 10]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tapekit import main_loop  # noqa: E402
from tapekit.store import SQLiteStore  # noqa: E402
from tapekit.studio import create_app  # noqa: E402
from tapekit.studio.app import serve_in_thread  # noqa: E402
from tapekit.testing.analyst import ENVIRONMENT, MeteredBrain, make_analyst, start_tape  # noqa: E402

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


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
        for event in main_loop(make_analyst(MeteredBrain(latency_s=0.05)), start, ENVIRONMENT):
            record(event)
        store.flush()
        app = create_app(
            store, agents={"analyst": lambda: (make_analyst(MeteredBrain(latency_s=0.05)), ENVIRONMENT)}
        )
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
