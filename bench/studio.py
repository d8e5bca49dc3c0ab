"""How fast the Studio opens a long tape: a 10,000-step session in a temporary SQLite store,
served by a real uvicorn; times the HTTP GETs of its pages and prints plain figures.

The tape alternates node runs of a root agent (one stored LLM call each) with observations,
and every 50 steps the root Calls a subagent that Responds, so the view stack has two levels.
"Cold" is the first request for the tape after the app starts (nothing cached); "warm" is the
median of the next ones.

Run: ``python bench/studio.py [--steps 10000] [--repeat 7]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from tapekit import (  # noqa: E402
    AssistantThought,
    Call,
    LLMCall,
    LLMOutput,
    Prompt,
    Respond,
    Step,
    StepMetadata,
    Tape,
    UserStep,
)
from tapekit.store import SQLiteStore  # noqa: E402
from tapekit.studio import create_app  # noqa: E402
from tapekit.studio.app import serve_in_thread  # noqa: E402


def build(store: SQLiteStore, n_steps: int, variant: str = "") -> str:
    """Save a tape of ``n_steps`` steps with its LLM calls; returns its id."""
    steps: list[Step] = [UserStep(content="Summarise the quarterly reports, one by one.")]
    depth = 0
    run = 0
    while len(steps) < n_steps:
        i = len(steps)
        agent = "root/helper" if depth else "root"
        pid = f"{variant}p{run}"
        run += 1
        if i % 50 == 0 and not depth:
            step: Step = Call(agent_name="helper", content=f"look at report {i}")
            depth = 1
        elif i % 50 == 25 and depth:
            step = Respond(content=f"report {i}: revenue up {i % 7}%")
            depth = 0
        else:
            text = f"Report {i}: reading section {i % 13}{variant if i > n_steps * 0.9 else ''}."
            step = AssistantThought(content=text)
        step.metadata = StepMetadata(agent=agent, node="work", prompt_id=pid, run_end=True)
        steps.append(step)
        prompt = Prompt(id=pid, messages=[{"role": "user", "content": f"What next after step {i}?"}])
        store.save_llm_call(
            LLMCall(
                prompt=prompt,
                output=LLMOutput(content=text if i % 50 else "call"),
                prompt_tokens=40,
                output_tokens=12,
            )
        )
        if len(steps) < n_steps and not isinstance(step, Call | Respond):
            steps.append(UserStep(content=f"section {i % 13} of report {i}: ..."))
    tape = Tape(steps=steps[:n_steps])
    store.save_tape(tape)
    store.flush()
    return tape.metadata.id


def timed(client: httpx.Client, url: str, must_contain: str) -> float:
    t0 = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - t0
    if response.status_code != 200 or must_contain not in response.text:
        raise SystemExit(f"GET {url}: {response.status_code}\n{response.text[:500]}")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    """Build the tapes, serve the Studio, time the pages, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    n, last = args.steps, args.steps - 1
    with (
        tempfile.TemporaryDirectory() as tmp,
        SQLiteStore(Path(tmp) / "bench.db", flush_interval_s=0.005) as store,
    ):
        t0 = time.perf_counter()
        a = build(store, n)
        b = build(store, n, variant="x")
        print(f"built two {n}-step tapes with their LLM calls in {time.perf_counter() - t0:.1f} s")
        pages: list[tuple[str, str, str]] = [
            ("tape page (first 200 steps)", f"/tapes/{a}", 'id="step-199"'),
            ("tape page (last page)", f"/tapes/{a}?page={last // 200 + 1}", f'id="step-{last}"'),
            ("step page (last step)", f"/tapes/{a}/steps/{last}", "Tape view stack"),
            ("step page (middle step)", f"/tapes/{a}/steps/{n // 2}", "Tape view stack"),
            ("step panel (fragment, middle)", f"/tapes/{a}/steps/{n // 2 + 2}?fragment=1", "Tape view stack"),
            ("tape list", "/tapes", a),
            ("diff of the two tapes", f"/diff?a={a}&b={b}", "first-divergence"),
        ]
        results: dict[str, Any] = {}
        for label, url, needle in pages:
            with (
                serve_in_thread(create_app(store)) as base,
                httpx.Client(base_url=base, timeout=60) as client,
            ):
                cold = timed(client, url, needle)
                warm = [timed(client, url, needle) for _ in range(args.repeat)]
                results[label] = (cold, statistics.median(warm))
        print(f"Studio over a {n}-step tape (SQLite, real uvicorn, HTTP GET, {args.repeat} warm runs):")
        print(f"{'page':<34} {'cold ms':>9} {'warm ms':>9}")
        for label, (cold, warm) in results.items():
            print(f"{label:<34} {cold * 1000:>9.1f} {warm * 1000:>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
