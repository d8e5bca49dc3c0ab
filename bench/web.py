"""Episodes per minute of the browser environment with the programmatic teacher, against stock
BrowserGym on the same tasks.

tapekit: one ``WebEnvironment`` per concurrency level (1, 2 and 4 episodes at a time; the
browser is launched and warmed up with one episode before the clock starts), ``--episodes``
teacher episodes over the 14 training tasks in turn, training seeds from 1000. Stock BrowserGym
(``--browsergym``, where it is installed: see tests/web/_stock.py): the same tasks and number of
seeds, with its gym environment in 1, 2 or 4 worker processes (it drives Playwright's sync API,
one per process), its default 0.5 s ``pre_observation_delay``, and the same teacher policy on
the same compact tree. Its seeds map to other pages than tapekit's (BrowserGym derives the page
seed from the seed), so success is compared in aggregate.

Figures: episodes per minute (wall clock, all episodes), the teacher's success, seconds per
reset (task loaded and first observation) and per step (action and observation), medians and
90th percentiles, and memory: the proportional set size (PSS) of the browser processes
(Chromium and Playwright's driver), sampled every 0.2 s, at the peak, and the peak minus the
idle browser divided by the concurrency (memory per concurrent episode). The compact tree's size
is reported in characters and, where the embedded model is installed, SmolLM2 tokens.

    python bench/web.py [--episodes 42] [--concurrency 1 2 4] [--browsergym] [--bg-episodes 14]
    python bench/web.py --teacher-seeds 100    # the teacher's success per task on training seeds
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.web._stock: stock BrowserGym

from tapekit import async_main_loop
from tapekit.web import WebEnvironment, WebObservation
from tapekit.web.miniwob import TRAIN_TASKS, start_tape
from tapekit.web.teacher import teach, teacher_agent

FIRST_SEED = 1000


# --------------------------------------------------------------------------- memory


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            out.setdefault(int(stat[stat.rfind(")") + 2 :].split()[1]), []).append(int(entry.name))
    return out


def browser_pss_mb(root: int) -> float:
    """PSS (MB) of the Chromium and Playwright-driver processes below ``root``."""
    children = _children()
    total_kb = 0
    stack = list(children.get(root, []))
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if comm not in ("chromium", "node", "chrome", "headless_shell"):
                continue
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total_kb += int(line.split()[1])
                    break
        except OSError:
            continue
    return total_kb / 1024


@contextmanager
def sampling(interval_s: float = 0.2) -> Iterator[list[float]]:
    """Sample the browser processes' PSS below this process while the block runs."""
    samples: list[float] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            samples.append(browser_pss_mb(os.getpid()))
            stop.wait(interval_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join()


# --------------------------------------------------------------------------- results


@dataclass
class Run:
    """One configuration's figures."""

    name: str
    concurrency: int
    episodes: int = 0
    solved: int = 0
    wall_s: float = 0.0
    reset_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    tree_chars: list[int] = field(default_factory=list)
    trees: list[str] = field(default_factory=list)
    idle_mb: float = 0.0
    peak_mb: float = 0.0

    def line(self) -> str:
        per_min = 60 * self.episodes / self.wall_s if self.wall_s else 0.0
        per_episode = (self.peak_mb - self.idle_mb) / self.concurrency
        return (
            f"{self.name:<11}{self.concurrency:>3}  {per_min:>7.1f}  {self.solved:>4}/{self.episodes:<4}"
            f"{_q(self.reset_s)}  {_q(self.step_s)}  {self.peak_mb:>7.0f}  {per_episode:>7.0f}"
        )


def _q(values: list[float]) -> str:
    if not values:
        return f"{'-':>13}"
    ordered = sorted(values)
    return f"{statistics.median(ordered):>6.2f}/{ordered[int(0.9 * (len(ordered) - 1))]:<6.2f}"


def episodes(n: int) -> list[tuple[str, int]]:
    """``n`` (task, seed) pairs: the training tasks in turn, training seeds from 1000."""
    return [(TRAIN_TASKS[i % len(TRAIN_TASKS)], FIRST_SEED + i // len(TRAIN_TASKS)) for i in range(n)]


# --------------------------------------------------------------------------- tapekit


async def run_tapekit(n: int, concurrency: int) -> Run:
    run = Run("tapekit", concurrency)
    agent = teacher_agent()
    async with WebEnvironment(max_concurrent=concurrency) as env:
        await env.astart()
        await async_main_loop(agent, start_tape("click-button", 1), env).get_final_tape()
        await asyncio.sleep(0.5)
        run.idle_mb = browser_pss_mb(os.getpid())
        todo = list(episodes(n))
        started = time.perf_counter()

        async def worker() -> None:
            while todo:
                task, seed = todo.pop(0)
                tape = await async_main_loop(agent, start_tape(task, seed), env).get_final_tape()
                obs = [s for s in tape.steps if isinstance(s, WebObservation)]
                run.episodes += 1
                run.solved += obs[-1].reward > 0
                if obs[-1].reward <= 0:
                    errors = [o.last_action_error for o in obs if o.last_action_error]
                    print(f"  tapekit failed {task}/{seed}: {errors or obs[-1].info}", flush=True)
                run.reset_s.append(obs[0].metadata.other["browser_s"])
                run.step_s.extend(o.metadata.other["browser_s"] for o in obs[1:])
                run.tree_chars.extend(len(o.axtree) for o in obs)
                run.trees.extend(o.axtree for o in obs)

        with sampling() as samples:
            await asyncio.gather(*(worker() for _ in range(concurrency)))
        run.wall_s = time.perf_counter() - started
        run.peak_mb = max(samples, default=0.0)
    return run


# --------------------------------------------------------------------------- stock BrowserGym


def _stock_worker(jobs: list[tuple[str, int]]) -> list[dict[str, Any]]:
    from tests.web._stock import run_episode

    out = []
    for task, seed in jobs:
        episode = run_episode(task, seed, teach)
        out.append(
            {
                "reward": episode.reward,
                "reset_s": episode.reset_s,
                "step_s": episode.step_s,
                "chars": [len(o.axtree) for o in episode.observations],
                "error": episode.error,
            }
        )
    return out


def run_stock(n: int, concurrency: int) -> Run:
    run = Run("browsergym", concurrency)
    jobs = episodes(n)
    shares = [jobs[i::concurrency] for i in range(concurrency)]
    context = mp.get_context("spawn")
    with context.Pool(concurrency) as pool:
        pool.map(_stock_worker, [[("click-button", 1)]] * concurrency)  # warm the workers up
        run.idle_mb = 0.0  # BrowserGym starts its browsers per episode: nothing runs between
        started = time.perf_counter()
        with sampling() as samples:
            results = pool.map(_stock_worker, shares)
        run.wall_s = time.perf_counter() - started
    run.peak_mb = max(samples, default=0.0)
    for share in results:
        for episode in share:
            run.episodes += 1
            run.solved += episode["reward"] > 0
            run.reset_s.append(episode["reset_s"])
            run.step_s.extend(episode["step_s"])
            run.tree_chars.extend(episode["chars"])
            if episode["error"]:
                print(f"  browsergym episode error: {episode['error']}")
    return run


# --------------------------------------------------------------------------- tokens


def token_counter() -> Callable[[str], int] | None:
    """SmolLM2's tokenizer from the embedded model (vocabulary only), if installed."""
    try:
        from llama_cpp import Llama

        from tapekit.llm.llamacpp import smollm2_path

        model = Llama(model_path=str(smollm2_path()), vocab_only=True, verbose=False)
    except Exception:
        return None
    return lambda text: len(model.tokenize(text.encode(), add_bos=False))


async def teacher_success(n_seeds: int, concurrency: int) -> None:
    """The teacher's success and steps per task on the first ``n_seeds`` training seeds."""
    from tapekit.web.miniwob import episodes as split_episodes

    agent = teacher_agent()
    results: dict[str, list[tuple[bool, int]]] = {task: [] for task in TRAIN_TASKS}
    todo = split_episodes("train", n_seeds=n_seeds)
    failures: list[str] = []
    started = time.perf_counter()
    async with WebEnvironment(max_concurrent=concurrency) as env:

        async def worker() -> None:
            while todo:
                task, seed = todo.pop(0)
                tape = await async_main_loop(agent, start_tape(task, seed), env).get_final_tape()
                obs = [s for s in tape.steps if isinstance(s, WebObservation)]
                results[task].append((obs[-1].reward > 0, len(obs) - 1))
                if obs[-1].reward <= 0:
                    failures.append(f"{task}/{seed}: {obs[-1].last_action_error or obs[-1].info}")

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    solved = sum(ok for runs in results.values() for ok, _ in runs)
    total = sum(len(runs) for runs in results.values())
    steps = [n for runs in results.values() for _, n in runs]
    for task, runs in results.items():
        wins, mean_steps = sum(ok for ok, _ in runs), statistics.mean(n for _, n in runs)
        print(f"{task:<18} {wins:>4}/{len(runs):<4} {100 * wins / len(runs):5.1f} %  steps {mean_steps:.1f}")
    rate, mean_steps = 100 * solved / total, statistics.mean(steps)
    print(f"{'all':<18} {solved:>4}/{total:<4} {rate:5.1f} %  steps {mean_steps:.2f}")
    print(f"{total} episodes in {time.perf_counter() - started:.0f} s")
    for failure in failures:
        print(f"  failed {failure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=42, help="tapekit episodes per concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--browsergym", action="store_true", help="also run stock BrowserGym")
    parser.add_argument("--bg-episodes", type=int, default=14, help="stock BrowserGym episodes per level")
    parser.add_argument("--teacher-seeds", type=int, default=0, help="only measure the teacher's success")
    args = parser.parse_args()
    if args.teacher_seeds:
        uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        print(f"teacher on training seeds 0-{args.teacher_seeds - 1} of {len(TRAIN_TASKS)} tasks; {uptime}")
        asyncio.run(teacher_success(args.teacher_seeds, max(args.concurrency)))
        return
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.platform()}")
    chromium = subprocess.run(
        ["/usr/bin/chromium", "--version"], capture_output=True, text=True
    ).stdout.strip()
    print(f"{chromium}; before: {uptime}")
    print("             eps/min  solved   reset s (med/p90)  step s (med/p90)  peak MB  MB/episode")
    runs = []
    for concurrency in args.concurrency:
        run = asyncio.run(run_tapekit(args.episodes, concurrency))
        runs.append(run)
        print(run.line(), flush=True)
    if args.browsergym:
        from tests.web._stock import missing

        why = missing()
        if why is not None:
            print(f"browsergym skipped: {why}")
        else:
            for concurrency in args.concurrency:
                run = run_stock(args.bg_episodes, concurrency)
                runs.append(run)
                print(run.line(), flush=True)
    chars = [c for r in runs if r.name == "tapekit" for c in r.tree_chars]
    size = f"compact tree: mean {statistics.mean(chars):.0f} chars, max {max(chars)}"
    count = token_counter()
    if count is not None:
        tokens = [count(t) for r in runs if r.name == "tapekit" for t in r.trees]
        size += f"; SmolLM2 tokens mean {statistics.mean(tokens):.0f}, max {max(tokens)}"
    print(size)
    after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"after: {after}")


if __name__ == "__main__":
    main()
