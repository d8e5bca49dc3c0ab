"""The tape store's write throughput and read latency, on SQLite and on PostgreSQL.

Writes: every tape is saved after each step (as the session recorder does), so each save writes
one new step row and upserts the tape row; figures are steps written per second, from the
first save to the last commit, with one writer and with 4 writer processes on one database.
Each step but a tape's first also writes its LLM call (``--calls ids``, the default: with a
``TokenTrace`` of 300 prompt ids, 40 output ids and their log-probabilities, stored compactly;
``--calls text``: the call without ids; ``--calls none``: steps only, as before token ids).
Reads: the time to read a whole 10,000-step tape (``get_tape``, then every step: a read tape
fetches and parses its steps as they are read) and its first page (``get_steps(id, 0, 100)``),
median of several runs.

PostgreSQL runs on a throwaway cluster started from this machine's server binaries, with the
server's default durability (fsync and synchronous commit on); it is skipped, saying why, when
the binaries or psycopg are missing. SQLite runs in WAL mode with ``synchronous=NORMAL``
(commits are not fsynced one by one), so the two are not equally durable.

    python bench/store.py [--steps 10000] [--writers 4] [--calls ids|text|none] [--no-postgres]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from tapekit import AssistantThought, LLMCall, LLMOutput, Prompt, Tape, UserStep
from tapekit.llm.base import TokenTrace
from tapekit.store import open_store
from tapekit.testing.postgres import TempPostgres, postgres_unavailable

STEPS_PER_TAPE = 50
TEXT = "The quarterly revenue grew by 12 percent, driven by aggregates pricing and volume. " * 3


# made once: the backend builds a call's trace, the store's cost is what the bench measures
TRACE = TokenTrace(
    prompt_ids=[(7 * k) % 49152 for k in range(300)],
    output_ids=[(13 * k) % 49152 for k in range(40)],
    output_logprobs=[-0.01 * k for k in range(40)],
    tokenizer="tk1-49152-0123456789abcdef",
    finish_reason="stop",
)


def make_call(i: int, worker: int, calls: str) -> LLMCall:
    """The LLM call of step ``i``: a 2-message prompt, the step's text as output, and (``ids``)
    a trace of 300 prompt ids and 40 output ids with log-probabilities."""
    trace = TRACE if calls == "ids" else None
    return LLMCall(
        prompt=Prompt(
            id=f"w{worker}-p{i}-{time.time_ns()}",
            messages=[
                {"role": "system", "content": "You are an analyst."},
                {"role": "user", "content": TEXT},
            ],
        ),
        output=LLMOutput(content=f"{i}: {TEXT}"),
        model="bench",
        prompt_tokens=300,
        output_tokens=40,
        tokens=trace,
    )


def make_step(i: int, worker: int) -> AssistantThought:
    step = AssistantThought(content=f"{i}: {TEXT}")
    step.metadata.agent, step.metadata.node, step.metadata.prompt_id = f"agent{worker}", "think", f"p{i}"
    return step


def write(url: str, n_steps: int, worker: int, calls: str = "ids") -> tuple[float, float]:
    """Write ``n_steps`` steps as tapes of STEPS_PER_TAPE steps, saved after every step;
    returns (start, end) wall-clock times, end after the last commit."""
    with open_store(url) as store:
        start = time.time()
        written = 0
        t = 0
        while written < n_steps:
            tape = Tape(steps=[UserStep(content="question")])
            key = store.save_tape(tape, f"w{worker}-{t}", tags=["bench"])
            written += 1
            for i in range(1, STEPS_PER_TAPE):
                if written >= n_steps:
                    break
                tape = tape.append(make_step(i, worker))
                if calls != "none":
                    store.save_llm_call(make_call(i, worker, calls))
                store.save_tape(tape, key)
                written += 1
            t += 1
        store.flush()
        return start, time.time()


def _worker(args: tuple[str, int, int, mp.Barrier, str]) -> tuple[float, float]:  # type: ignore[type-arg]
    url, n_steps, worker, barrier, calls = args
    barrier.wait()
    return write(url, n_steps, worker, calls)


def throughput(url: str, n_steps: int, writers: int, calls: str = "ids") -> float:
    """Steps per second with ``writers`` processes each writing ``n_steps`` steps."""
    if writers == 1:
        start, end = write(url, n_steps, 0, calls)
        return n_steps / (end - start)
    ctx = mp.get_context("spawn")
    barrier = ctx.Manager().Barrier(writers)
    with ctx.Pool(writers) as pool:
        spans = pool.map(_worker, [(url, n_steps, w, barrier, calls) for w in range(writers)])
    return writers * n_steps / (max(e for _, e in spans) - min(s for s, _ in spans))


def read_latency(url: str, n_steps: int = 10_000, repeats: int = 5) -> tuple[float, float]:
    """Median seconds to ``get_tape`` a ``n_steps``-step tape and read all its steps, and to
    ``get_steps`` its first 100."""
    with open_store(url) as store:
        tape = Tape(steps=[UserStep(content="question")]).extend(make_step(i, 0) for i in range(1, n_steps))
        key = store.save_tape(tape, "long")
        store.flush()
    with open_store(url) as store:  # a fresh reader, as the Studio would be
        full, page = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            loaded = store.get_tape(key)
            loaded.steps.to_list()  # every step read (and parsed), as before reads were lazy
            full.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            first = store.get_steps(key, 0, 100)
            page.append(time.perf_counter() - t0)
        assert len(loaded) == n_steps and len(first) == 100
    return statistics.median(full), statistics.median(page)


def run(name: str, make_url: object, n_steps: int, writers: int, calls: str = "ids") -> None:
    one = throughput(make_url(), n_steps, 1, calls)  # type: ignore[operator]
    many = throughput(make_url(), n_steps, writers, calls)  # type: ignore[operator]
    full, page = read_latency(make_url())  # type: ignore[operator]
    print(f"{name:<10} write 1 writer         {one:>10,.0f} steps/s")
    print(f"{name:<10} write {writers} writer procs  {many:>10,.0f} steps/s")
    print(f"{name:<10} get_tape, read 10k     {full * 1000:>10.1f} ms")
    print(f"{name:<10} get_steps(0, 100)      {page * 1000:>10.1f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps per writer")
    parser.add_argument("--writers", type=int, default=4, help="writer processes")
    parser.add_argument("--calls", choices=["ids", "text", "none"], default="ids", help="LLM call per step")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.platform()}")
    print(
        f"{args.steps} steps per writer, tapes of {STEPS_PER_TAPE} steps saved after every step, "
        f"LLM calls: {args.calls}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        counter = iter(range(1_000))
        path = lambda: str(Path(tmp) / f"bench{next(counter)}.db")  # noqa: E731
        run("sqlite", path, args.steps, args.writers, args.calls)
    why = "--no-postgres" if args.no_postgres else postgres_unavailable()
    if why is not None:
        print(f"postgres   skipped: {why}")
        return
    with TempPostgres(durable=True) as pg:
        run("postgres", pg.create_database, args.steps, args.writers, args.calls)


if __name__ == "__main__":
    main()
