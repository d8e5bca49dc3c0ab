"""scripts/teacherless_tapes.py on a store written by tapekit: how evaluation episodes ended
and began, and the rollouts' success by blocks of steps."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from tapekit import Tape
from tapekit.store import SQLiteStore
from tapekit.web import Click, OpenTask, WebAbort, WebObservation

ROOT = Path(__file__).resolve().parents[1]


def _script() -> Any:
    spec = importlib.util.spec_from_file_location(
        "teacherless_tapes", ROOT / "scripts" / "teacherless_tapes.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _episode(task: str, seed: int, bids: list[str], abort: bool) -> Tape[Any, Any]:
    steps: list[Any] = [OpenTask(task=f"miniwob.{task}", seed=seed)]
    for i, bid in enumerate(bids):
        steps += [WebObservation(task=task, seed=seed, episode_id="e", goal="g", step=i), Click(bid=bid)]
    if abort:
        steps.append(WebAbort(reason="the same action four times"))
    return Tape(steps=steps)


def test_tables_from_a_store(tmp_path: Path) -> None:
    script = _script()
    with SQLiteStore(tmp_path / "tapes.db") as store:
        for seed, bids, abort, passed in [
            (1, ["4", "4", "4"], True, False),
            (2, ["4"], False, True),
            (3, ["9"], False, False),
        ]:
            tape_id = store.save_tape(_episode("click-tab", seed, bids, abort), f"e{seed}")
            tags = [f"eval:val40:task:click-tab/{seed}", f"eval:val40:{'passed' if passed else 'failed'}"]
            store.add_tags(tape_id, tags)
        for step, reward in [(0, 0.0), (1, 1.0), (12, 1.0), (13, 1.0)]:
            tape = _episode("click-tab", 500 + step, ["4"], False)
            tape = tape.with_metadata(result={"rl_step": step, "category": "click-tab", "reward": reward})
            tape_id = store.save_tape(tape, f"r{step}")
            store.add_tags(tape_id, ["rl:run0"])
    db = script.connect(tmp_path)
    table = script.evaluation_table(db, "val40")
    assert table == {
        "click-tab": {"episodes": 3, "solved": 1, "aborted": 1, "first_actions": 2, "commonest_first": 2}
    }
    assert script.rollout_blocks(db, "run0", 10) == {"click-tab": {0: (0.5, 2), 1: (1.0, 2)}}
