"""``tapekit train sft|dpo|rl CONFIG [flags]``: the trainers from the command line.

A config file (YAML or JSON, the fields of :class:`~tapekit.training.config.SFTConfig`,
:class:`~tapekit.training.config.DPOConfig` or :class:`~tapekit.training.rl.RLRunConfig`)
with flags on top; ``--set key=value`` reaches any
field (``--set lora.r=8``). Runs as well under ``accelerate launch`` (one process per device).
Only typer is imported here; the trainers load when a command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

train_app = typer.Typer(
    name="train",
    help="Fine-tune a model on samples made from tapes (SFT, DPO) or by RL on its rollouts (train extra).",
    no_args_is_help=True,
    add_completion=False,
)


def _overrides(
    model: str | None,
    dataset: str | None,
    output_dir: str | None,
    max_steps: int | None,
    lora: bool | None,
    resume: bool,
    sets: list[str],
) -> dict[str, Any]:
    from tapekit.training.config import parse_overrides

    out = parse_overrides(sets)
    flags = {"model": model, "dataset": dataset, "output_dir": output_dir, "max_steps": max_steps}
    for key, value in flags.items():
        if value is not None:
            out[key] = value
    if lora is False:
        out["lora"] = None
    elif lora is True and "lora" not in out:
        out["lora"] = {}
    if resume:
        out["resume"] = True
    return out


def _check_config_file(config_file: Path | None) -> None:
    """Fail with a message naming the file (and the line, for bad UTF-8) before the config is
    parsed: a config file that is there but cannot be read as UTF-8 text."""
    from tapekit._cli.common import read_text

    if config_file is not None and config_file.is_file():
        read_text(config_file)


def _run(kind: str, config_file: Path | None, overrides: dict[str, Any]) -> None:
    from tapekit._cli.common import CliError

    try:
        from tapekit.errors import TrainingError
        from tapekit.training.config import DPOConfig, SFTConfig, load_config

        _check_config_file(config_file)
        cls = SFTConfig if kind == "sft" else DPOConfig
        config = load_config(cls, config_file, overrides)
        if config.dataset is None:
            raise TrainingError("no dataset: set `dataset` in the config or pass --dataset")
        if kind == "sft":
            from tapekit.training.sft import train_sft

            result = train_sft(config.dataset, config.model, config=config)  # type: ignore[arg-type]
        else:
            from tapekit.training.dpo import train_dpo

            result = train_dpo(config.dataset, config.model, config=config)  # type: ignore[arg-type]
    except ImportError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (CliError, TrainingError, ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    finally:  # a failed run exits next as well, so it leaves the group too
        _leave_process_group()
    import os

    if os.environ.get("RANK", "0") == "0":  # one line under accelerate/torchrun, not one per process
        typer.echo(f"saved {result}")


_CONFIG = typer.Argument(None, help="YAML or JSON config file (optional if flags give model and dataset)")
_MODEL = typer.Option(None, "--model", help="local model directory (the base model for LoRA)")
_DATASET = typer.Option(None, "--dataset", help="samples: .parquet, .jsonl or a datasets directory")
_OUTPUT = typer.Option(None, "--output-dir", help="checkpoints and the result (output_dir/final)")
_STEPS = typer.Option(None, "--max-steps", help="stop after this many optimiser steps")
_LORA = typer.Option(None, "--lora/--full", help="train a LoRA adapter (default) or every weight")
_RESUME = typer.Option(False, "--resume", help="continue from the newest checkpoint in output_dir")
_SET = typer.Option([], "--set", help="any config field: --set learning_rate=1e-4 --set lora.r=8")


@train_app.command("sft")
def sft_command(
    config: Path | None = _CONFIG,
    model: str | None = _MODEL,
    dataset: str | None = _DATASET,
    output_dir: str | None = _OUTPUT,
    max_steps: int | None = _STEPS,
    lora: bool | None = _LORA,
    resume: bool = _RESUME,
    set_: list[str] = _SET,
) -> None:
    """Supervised fine-tuning (loss only on the model's own tokens, packed without padding)."""
    _run("sft", config, _overrides(model, dataset, output_dir, max_steps, lora, resume, set_))


@train_app.command("dpo")
def dpo_command(
    config: Path | None = _CONFIG,
    model: str | None = _MODEL,
    dataset: str | None = _DATASET,
    output_dir: str | None = _OUTPUT,
    max_steps: int | None = _STEPS,
    lora: bool | None = _LORA,
    resume: bool = _RESUME,
    set_: list[str] = _SET,
) -> None:
    """Direct preference optimisation on (prompt, chosen, rejected) pairs made from tapes."""
    _run("dpo", config, _overrides(model, dataset, output_dir, max_steps, lora, resume, set_))


def _rl(config_file: Path | None, overrides: dict[str, Any]) -> None:
    from tapekit._cli.common import CliError

    try:
        import inspect
        import warnings

        from tapekit._cli.common import project_on_path
        from tapekit._loading import load_object
        from tapekit.errors import TrainingError
        from tapekit.training.config import load_config
        from tapekit.training.rl import RLRunConfig, RLSetup, train_rl

        _check_config_file(config_file)
        with warnings.catch_warnings(record=True) as caught:  # an old flat config file: say so
            warnings.simplefilter("always", DeprecationWarning)
            config = load_config(RLRunConfig, config_file, overrides)
        for warning in caught:
            typer.echo(f"warning: {warning.message}", err=True)
        if config.setup is None or config.model is None:
            raise TrainingError(
                "tapekit train rl needs `setup` (module:attr) and `model` (a model directory)"
            )
        project_on_path()
        make_setup = load_object(config.setup)
        try:  # the arguments are checked against the callable, not caught from inside it
            inspect.signature(make_setup).bind(**config.setup_args)
        except TypeError as e:
            raise TrainingError(
                f"setup {config.setup!r} does not take setup_args {config.setup_args}: {e}"
            ) from None
        setup = make_setup(**config.setup_args)
        if not isinstance(setup, RLSetup):
            raise TrainingError(f"setup {config.setup!r} must return an RLSetup, got {type(setup).__name__}")
        from tapekit.testing.tiny import load_tiny

        model, tokenizer = load_tiny(config.model)
        try:
            result = train_rl(setup, model, tokenizer, config, callbacks=[_echo_steps()])
        finally:  # an environment with a browser or a server behind it is closed with the run
            close = getattr(setup.environment, "close", None)
            if callable(close):
                close()
        final = Path(config.output_dir) / "final"
        if not _main_process():
            return  # data-parallel: the ranks ended with equal weights (checked); rank 0 saves
        model.save_pretrained(final)
        tokenizer.save_pretrained(final)
    except ImportError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except (CliError, TrainingError, ValueError, FileNotFoundError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"saved {final} ({len(result.history)} steps, policy version {result.policy_version})")


def _leave_process_group() -> None:
    """Leave the process group the trainer's ``accelerate`` state joined under ``accelerate
    launch``/``torchrun``: this process ends next, and one that exits with a gloo group up can
    abort (SIGABRT) while the interpreter finalises. Nothing happens in a plain run."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _main_process() -> bool:
    """Whether this is the only process or rank 0 of ``accelerate launch``/``torchrun``."""
    import os

    return os.environ.get("RANK", "0") == "0"


def _echo_steps() -> Any:
    """A step callback that prints one line per RL step (on the main process): the reward, the
    zero-advantage share, clipping, KL, the policy lag and the curriculum's probabilities."""
    from tapekit.training.callbacks import StepCallback, StepRecord
    from tapekit.training.rl import RLStepRecord

    class EchoSteps(StepCallback):
        def on_step(self, record: StepRecord) -> bool | None:
            if not _main_process() or not isinstance(record, RLStepRecord):
                return None
            probs = " ".join(f"{c}={p:.2f}" for c, p in record.sampler_probs.items())
            # None: the environment failed every rollout of the step
            reward = "none" if record.reward is None else f"{record.reward:.3f}"
            typer.echo(
                f"step={record.step - 1} reward={reward} zero_adv={record.zero_adv_share:.2f} "
                f"clip={record.clip_fraction:.3f} kl={record.kl:.4f} lag={record.policy_lag} probs: {probs}"
            )
            return None

    return EchoSteps()


@train_app.command("rl")
def rl_command(
    config: Path | None = _CONFIG,
    model: str | None = _MODEL,
    output_dir: str | None = _OUTPUT,
    steps: int | None = typer.Option(None, "--steps", help="RL steps"),
    resume: bool = _RESUME,
    set_: list[str] = _SET,
) -> None:
    """On-policy RL (GRPO) on the agent's own rollouts, with a curriculum; resumable."""
    from tapekit.training.config import parse_overrides

    overrides = parse_overrides(set_)
    for key, value in (("model", model), ("output_dir", output_dir), ("steps", steps)):
        if value is not None:
            overrides[key] = value
    if resume:
        overrides["resume"] = True
    _rl(config, overrides)
