"""The RL stage of the math distillation: GRPO on the SFT student's own tapes, with a curriculum.

After SFT, the student solves training problems itself (``group_size`` sampled attempts per
problem, batched), each attempt is scored strict (the reward) and lenient, and the student is
trained by :func:`tapekit.training.rl.train_rl` with a curriculum over the difficulty
levels (SEC by default: levels where the attempts disagree are drawn more; ``--levels 5`` adds
two levels beyond what SFT taught, a hard tail for the curriculum to avoid). Exact and
lenient match on the validation problems (``examples.math_study.problems.split_problems``:
none shares a training problem's arithmetic) are measured before, every ``eval_every`` steps
and after, with the same batched greedy decoding, and printed as ``stage=rl ... split=val``
lines like the other stages (pass@1 with 95 % intervals), with the curriculum's arm
probabilities. The RL pool is the training problems only.

Run alone on a saved SFT model: ``python -m examples.math_study.rl_stage MODEL_DIR [--seconds 300]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapekit.evaluate import EvalReport, Task

from .agents import STUDENT_SYSTEM, calculator_environment, make_student
from .problems import ALL_LEVELS, DIFFICULTIES, HARDER, LEVELS, Problem, difficulty, split_problems
from .scoring import MAX_LOOPS, SCORERS, evaluate_agent, pass_at_1_text, step_credit, tasks_for

if TYPE_CHECKING:
    from tapekit.training import RLStepRecord

__all__ = [
    "RLStageResult",
    "RLStageSettings",
    "after_sft",
    "easy_to_hard",
    "math_setup",
    "pool_levels",
    "rl_stage",
]


@dataclass
class RLStageSettings:
    """The RL stage's knobs (see :class:`tapekit.training.rl.RLRunConfig` for the GRPO ones)."""

    seconds: float = 300.0  # wall-clock budget of the training steps (evaluations excluded)
    max_steps: int = 200
    tasks_per_step: int = 16  # 16 x 8 rollouts per step: less noise per update
    group_size: int = 8
    # measured (docs/training.md, fourth round): at sampling temperature 0.5, 2e-4 x 2 steps per
    # batch gained 3-9 points on a 0.60 student; 5e-4 lost 5-10 points, 1e-3 collapsed to 0
    learning_rate: float = 2e-4
    # at 1.0 the 0.60 student's samples were right 0.30 of the time (its greedy answers 0.60):
    # RL then trains away sampling noise that greedy decoding never meets; at 0.5, 0.55
    temperature: float = 0.5
    reward: str = "strict"  # or "steps": partial credit per correct calculator call
    max_tokens: int = 48
    curriculum: str = "sec"
    resample_rounds: int = 0  # > 0: groups without a signal are replaced by new draws (RLRunConfig)
    # the curriculum's arms: "levels" (3) or "sizes" (5: each level above 1 split by whether a
    # number of 100 or more comes up, which separates what the students solve from what they never do)
    arms: str = "levels"
    # a sharp bandit (0.1) drew level1 only once the harder levels failed, and they were forgotten;
    # 0.3 gave the best run of the fourth round (0.60 -> 0.69)
    sec_temperature: float = 0.3
    sec_alpha: float = 0.5
    scale_rewards: bool = True
    ppo_epochs: int = 2  # optimiser steps per batch of rollouts (the ratio and clipping act)
    negative_scale: float = 1.0
    minibatches: int = 1
    max_grad_norm: float = 1.0
    mode: str = "sync"
    max_staleness: int = 1
    eval_every: int = 0  # steps between validation evaluations (0: before and after only)
    system: str | None = None  # the student's system message (None: make_student's default)
    seed: int = 0
    out: Path = field(default_factory=lambda: Path("rl-out"))


_SAME_AS_RL_RUN_CONFIG: dict[str, tuple[str, ...]] = {
    "": ("learning_rate", "max_grad_norm", "mode", "max_staleness", "seed"),
    "grpo": ("scale_rewards", "ppo_epochs", "negative_scale", "minibatches"),
    "rollouts": ("tasks_per_step", "group_size", "temperature", "max_tokens", "resample_rounds"),
    "curriculum": ("sec_temperature", "sec_alpha"),
}
"""The settings passed to :class:`~tapekit.training.rl.RLRunConfig` as they are, under the same
names, by section (``""``: the config's own fields); ``curriculum`` is the curriculum's ``kind``."""


@dataclass
class RLStageResult:
    """The stage's evaluations and step records."""

    before: EvalReport
    after: EvalReport
    history: list[RLStepRecord]
    train_seconds: float
    evals: list[tuple[int, float, float]] = field(default_factory=list)  # (step, exact, lenient)

    @property
    def zero_adv_groups(self) -> float:
        """The mean share of zero-advantage groups over the steps."""
        return sum(r.zero_adv_share for r in self.history) / max(len(self.history), 1)


def student_for(system: str | None) -> Any:
    """``make_student``, with the system message ``system`` when given (it must be the one the
    student was fine-tuned with)."""
    if system is None:
        return make_student
    return lambda llm: make_student(llm, system)  # type: ignore[call-arg]


# --arms: how a problem is graded into the curriculum's arms (None: its level), and the arms
# easiest first (the fixed curriculum's order; the arms a pool lacks are skipped)
ARMS: dict[str, tuple[Callable[[Problem], str] | None, list[str]]] = {
    "levels": (None, list(ALL_LEVELS)),
    "sizes": (difficulty, [*DIFFICULTIES, *HARDER]),
}


def arms_named(name: str) -> tuple[Callable[[Problem], str] | None, list[str]]:
    """The grading and the easy-to-hard arms of ``--arms name``; a ValueError for another name."""
    if name not in ARMS:
        raise ValueError(f"arms must be one of {sorted(ARMS)}, got {name!r}")
    return ARMS[name]


def easy_to_hard(arms: str, tasks: list[Task]) -> list[str]:
    """The fixed curriculum's order: the arms of ``--arms arms`` easiest first, those that no
    task of ``tasks`` falls in left out."""
    graded = {task.category for task in tasks}
    return [arm for arm in arms_named(arms)[1] if arm in graded]


def math_setup(
    problems: list[Problem], system: str | None = None, reward: str = "strict", arms: str = "levels"
) -> Any:
    """The :class:`~tapekit.training.rl.RLSetup` of the student on ``problems``: strict,
    lenient and step credit (:func:`~examples.math_study.scoring.step_credit`) reported, ``reward``
    names the one trained on; ``arms`` ("levels" or "sizes") grades the tasks' categories, which
    are the curriculum's arms."""
    from tapekit.training import RLSetup

    grade, _ = arms_named(arms)
    return RLSetup(
        agent_for=student_for(system),
        environment=calculator_environment(),
        tasks=tasks_for(problems, grade),
        scorers={**SCORERS, "steps": step_credit(problems)},
        reward=reward,
    )


def heldout_eval(
    model: Any, tokenizer: Any, tasks: list[Task], name: str, store: Any = None, system: str | None = None
) -> EvalReport:
    """Greedy evaluation of the model on ``tasks`` (the validation split), every problem at
    once (batched ``generate``)."""
    from tapekit.llm import BatchedTransformersLLM

    llm = BatchedTransformersLLM.from_model(
        model, tokenizer, model_name="tiny-rl", temperature=0.0, max_tokens=48
    )
    llm.batcher.max_wait_s = 0.02
    model.eval()
    return evaluate_agent(student_for(system)(llm), tasks, store, name, max_concurrency=len(tasks))


def line(report: EvalReport, step: int, seconds: float, extra: str = "") -> str:
    """``stage=rl student=tiny split=val n=.. exact=.. exact_95ci=[..] lenient=.. ... step=..``"""
    levels = report.by_category()
    per_level = " ".join(f"{c}={levels[c].pass_at_1('strict').value:.2f}" for c in ALL_LEVELS if c in levels)
    return (
        f"stage=rl student=tiny split=val {pass_at_1_text(report)} "
        f"tokens_per_task={report.tokens_per_attempt:.0f} step={step} train_seconds={seconds:.0f} "
        f"{per_level}{extra}"
    )


def _number(value: float | None) -> str:
    """A step's mean for the log: ``none`` where the step scored no rollout (every one failed
    by the environment), not 0."""
    return "none" if value is None else f"{value:.2f}"


def rl_stage(
    model: Any,
    tokenizer: Any,
    train: list[Problem],
    heldout: list[Task],
    settings: RLStageSettings,
    store: Any = None,
    echo: Any = print,
) -> RLStageResult:
    """RL on ``model`` (in place) over the ``train`` problems within ``settings.seconds``."""
    from tapekit.training import (
        CurriculumConfig,
        GRPOConfig,
        RLRunConfig,
        RLStepRecord,
        RolloutConfig,
        StepCallback,
        StepRecord,
        StopAfter,
        train_rl,
    )

    before = heldout_eval(
        model, tokenizer, heldout, f"rl-before-{settings.curriculum}", store, settings.system
    )
    echo(line(before, 0, 0.0, " (before RL)"), flush=True)
    setup = math_setup(train, settings.system, settings.reward, settings.arms)
    same = {
        section: {name: getattr(settings, name) for name in names}
        for section, names in _SAME_AS_RL_RUN_CONFIG.items()
    }
    # RLRunConfig checks these (the literals of curriculum.kind and mode included)
    config = RLRunConfig(
        output_dir=str(settings.out),
        run_name=f"math-{settings.curriculum}",
        steps=settings.max_steps,
        checkpoint=False,
        grpo=GRPOConfig(**same["grpo"]),
        rollouts=RolloutConfig(**same["rollouts"], max_loops=MAX_LOOPS),
        curriculum=CurriculumConfig(
            kind=settings.curriculum,
            fixed_order=easy_to_hard(settings.arms, setup.tasks),
            **same["curriculum"],
        ),
        **same[""],
    )
    evals: list[tuple[int, float, float]] = []
    budget = StopAfter(seconds=settings.seconds)  # training time: the evaluations are not counted

    class Progress(StepCallback):
        """One ``rl step=...`` line per step, and the validation evaluation every ``eval_every``."""

        def on_step(self, record: StepRecord) -> bool | None:
            assert isinstance(record, RLStepRecord)  # train_rl's records
            probs = " ".join(f"{c}={p:.2f}" for c, p in record.sampler_probs.items())
            echo(
                f"rl step={record.step - 1} reward={_number(record.reward)} "  # counted from 0, as in rl_log
                f"strict={_number(record.scores.get('strict'))} "
                f"lenient={_number(record.scores.get('lenient'))} zero_adv={record.zero_adv_share:.2f} "
                f"clip={record.clip_fraction:.3f} ratio={record.ratio_mean:.4f} "
                f"rollout_tok/s={record.rollout_tokens_per_s:.0f} "
                f"train_tok/s={record.train_tokens_per_s:.0f} "
                f"lag={record.policy_lag} s={record.step_seconds:.1f} probs: {probs}",
                flush=True,
            )
            if settings.eval_every and record.step % settings.eval_every == 0:
                report = heldout_eval(
                    model,
                    tokenizer,
                    heldout,
                    f"rl-{settings.curriculum}-{record.step}",
                    store,
                    settings.system,
                )
                evals.append(
                    (record.step, report.pass_at_1("strict").value, report.pass_at_1("lenient").value)
                )
                echo(line(report, record.step, budget.spent + record.step_seconds), flush=True)
            return None

    started = time.perf_counter()
    history = train_rl(setup, model, tokenizer, config, callbacks=[Progress(), budget]).history
    seconds = time.perf_counter() - started
    after = heldout_eval(model, tokenizer, heldout, f"rl-after-{settings.curriculum}", store, settings.system)
    mean_zero = sum(r.zero_adv_share for r in history) / max(len(history), 1)
    echo(
        line(
            after,
            len(history),
            budget.spent,
            f" zero_adv_groups={mean_zero:.2f} curriculum={settings.curriculum}",
        ),
        flush=True,
    )
    return RLStageResult(before, after, history, seconds, evals)


def pool_levels(n: int) -> list[str]:
    """The first ``n`` levels, easiest first: the three :data:`LEVELS`, then the :data:`HARDER`."""
    if not len(LEVELS) <= n <= len(ALL_LEVELS):
        raise ValueError(f"a pool has {len(LEVELS)} to {len(ALL_LEVELS)} levels, got {n}")
    return list(ALL_LEVELS)[:n]


def main(argv: list[str] | None = None) -> int:
    """RL on a saved SFT model directory: ``python -m examples.math_study.rl_stage MODEL_DIR``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="the SFT student's directory (sft-tiny/final)")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--curriculum", choices=["sec", "uniform", "fixed"], default="sec")
    parser.add_argument(
        "--arms", choices=sorted(ARMS), default="levels", help="the curriculum's categories of problems"
    )
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--tasks", type=int, default=16, help="tasks per step")
    parser.add_argument("--group", type=int, default=8, help="rollouts per task")
    parser.add_argument(
        "--levels",
        type=int,
        choices=[3, 4, 5],
        default=3,
        help="levels in the training and validation pools: 4 and 5 add a hard tail (level4, level5);"
        " SEC was measured there with --tasks 8 --group 16 --sec-temperature 0.4 (docs/training.md)",
    )
    parser.add_argument("--train", type=int, default=1500)
    parser.add_argument("--val", "--heldout", type=int, default=150, dest="val", help="validation problems")
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--sec-temperature", type=float, default=0.3)
    parser.add_argument("--sec-alpha", type=float, default=0.5)
    parser.add_argument("--temperature", type=float, default=0.5, help="sampling temperature")
    parser.add_argument("--reward", choices=["strict", "steps"], default="strict", help="what RL maximises")
    parser.add_argument("--epochs", type=int, default=2, help="passes over each step's rollouts")
    parser.add_argument("--minibatches", type=int, default=1, help="optimiser steps per pass")
    parser.add_argument("--negative-scale", type=float, default=1.0, help="weight of negative advantages")
    parser.add_argument("--dr-grpo", action="store_true", help="advantages not divided by the std")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("rl-out"))
    parser.add_argument(
        "--long-system", action="store_true", help="the student was tuned with STUDENT_SYSTEM"
    )
    args = parser.parse_args(argv)
    import torch  # after parsing: `--help` needs no training stack

    from tapekit.testing.tiny import load_tiny

    torch.set_num_threads(args.threads)
    model, tokenizer = load_tiny(args.model)
    train, val, _ = split_problems(args.train, args.val, seed=0, categories=pool_levels(args.levels))
    settings = RLStageSettings(
        seconds=args.seconds,
        learning_rate=args.lr,
        curriculum=args.curriculum,
        arms=args.arms,
        mode=args.mode,
        tasks_per_step=args.tasks,
        group_size=args.group,
        eval_every=args.eval_every,
        sec_temperature=args.sec_temperature,
        sec_alpha=args.sec_alpha,
        temperature=args.temperature,
        reward=args.reward,
        ppo_epochs=args.epochs,
        negative_scale=args.negative_scale,
        minibatches=args.minibatches,
        scale_rewards=not args.dr_grpo,
        seed=args.seed,
        out=args.out,
        system=STUDENT_SYSTEM if args.long_system else None,
    )
    rl_stage(model, tokenizer, train, tasks_for(val), settings)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())


def after_sft(
    model_dir: Path, train: list[Problem], heldout: list[Task], store: Any, settings: RLStageSettings
) -> tuple[EvalReport, float]:
    """The RL stage of ``examples/math_distill.py``: RL on the SFT result in ``model_dir`` over
    the ``train`` problems; returns the report on ``heldout`` (the validation tasks) after RL
    and the seconds spent training. The model is saved to ``settings.out / "final"``."""
    from tapekit.testing.tiny import load_tiny

    model, tokenizer = load_tiny(model_dir)
    result = rl_stage(model, tokenizer, train, heldout, settings, store)
    model.save_pretrained(settings.out / "final")
    tokenizer.save_pretrained(settings.out / "final")
    return result.after, sum(r.step_seconds for r in result.history)
