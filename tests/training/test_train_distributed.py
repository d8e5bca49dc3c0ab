"""`tapekit train sft` data-parallel under `accelerate launch` with 2 CPU processes (gloo): the
ranks train on disjoint samples and end with equal weights; the CLI's errors are clean."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tapekit.training._trace import sample_hash
from tests.training.train_helpers import make_model, sum_rows


def write_inputs(tmp: Path, **settings: object) -> Path:
    _, tok = make_model(tmp / "base")
    rows = sum_rows(tok, 48)
    with (tmp / "samples.jsonl").open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    config = {
        "model": "base",
        "dataset": "samples.jsonl",
        "output_dir": "out",
        "lora": None,
        "max_steps": 3,
        "batch_size": 1,
        "max_length": 64,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "device": "cpu",
        "trace_data": True,
        **settings,
    }
    path = tmp / "sft.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in config.items()))
    return path


def test_two_processes_see_disjoint_data_and_end_with_equal_weights(tmp_path: Path) -> None:
    # `--cpu` makes accelerate run ONE process; `--multi_gpu` starts torchrun's N processes, and
    # with no CUDA device (the config says device: cpu) they train on CPU over gloo
    config = write_inputs(tmp_path)
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_port", "29517",
        "-m", "tapekit.cli", "train", "sft", str(config),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "step 3/3" in done.stdout and "tokens/s" in done.stdout
    traces = []
    for rank in (0, 1):
        lines = [
            json.loads(x) for x in (tmp_path / "out" / f"trace-rank{rank}.jsonl").read_text().splitlines()
        ]
        seen = [h for line in lines if "samples" in line for h in line["samples"]]
        weights = [line["weights"] for line in lines if "weights" in line]
        traces.append((seen, weights))
    (seen0, weights0), (seen1, weights1) = traces
    rows = [json.loads(x) for x in (tmp_path / "samples.jsonl").read_text().splitlines()]
    known = {sample_hash(r["input_ids"]) for r in rows}
    assert seen0 and seen1 and set(seen0) <= known and set(seen1) <= known
    assert not set(seen0) & set(seen1)  # disjoint shares of the data
    assert len(weights0) == len(weights1) == 1 and weights0 == weights1  # one model after all
    assert (tmp_path / "out" / "final" / "model.safetensors").is_file()


def test_cli_single_process_and_clean_errors(tmp_path: Path) -> None:
    config = write_inputs(tmp_path, max_steps=2, trace_data=False, save_steps=1)
    cli = [sys.executable, "-m", "tapekit.cli", "train", "sft"]
    done = subprocess.run([*cli, str(config)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "saved" in done.stdout and (tmp_path / "out" / "checkpoint-2").is_dir()
    # resume: the flags override the file; nothing is left to do after step 2 of 3, then step 3
    again = [*cli, str(config), "--resume", "--max-steps", "3", "--set", "logging_steps=1"]
    done = subprocess.run(again, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 3/3" in done.stdout and "step 1/3" not in done.stdout
    bad = subprocess.run(
        [*cli, str(config), "--set", "lerning_rate=1"], capture_output=True, text=True, cwd=tmp_path
    )
    assert bad.returncode == 2 and "lerning_rate" in bad.stderr and "Traceback" not in bad.stderr
    missing = subprocess.run([*cli, "--model", "nowhere"], capture_output=True, text=True, cwd=tmp_path)
    assert missing.returncode == 2 and "no dataset" in missing.stderr
