"""A research lead that asks three search helpers at once (a ``Fork``), then merges the answers.

The team is :mod:`tapekit.testing.research`; this script runs it once with a stand-in model that
takes ``--latency`` seconds per call and prints the tape and the wall time: the three searches
take about the time of one.

    python examples/research.py   # 8 LLM calls of 200 ms in about 0.8 s: the three searches overlap
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from tapekit import render_tape
from tapekit.testing.research import arun, make_lead, start_tape


def main(argv: list[str] | None = None) -> int:
    """Run the team once and print the tape and the wall time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per LLM call")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    tape = asyncio.run(arun(make_lead(latency_s=args.latency), start_tape()))
    wall = time.perf_counter() - t0
    print(render_tape(tape))
    calls = len(make_lead().get_node_runs(tape))
    print(f"\n{len(tape)} steps, {calls} LLM calls of {args.latency:.2f} s each, wall time {wall:.2f} s")
    return 1 if tape.metadata.error else 0


if __name__ == "__main__":
    sys.exit(main())
