"""RL rollouts on OpenAI-compatible servers that load each new LoRA adapter (vLLM's protocol):
two real HTTP servers (``tests/training/vllm_like_server.py``, a tiny model behind FastAPI/uvicorn)
serve the rollouts of ``train_rl`` while it trains a LoRA adapter in this process. vLLM itself
is not run here (no GPU): the servers speak the subset of its protocol that tapekit uses."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tapekit.store import TapeFilter

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("torch", "datasets", "peft", "fastapi", "uvicorn")),
    reason="needs the train extra (torch, datasets, peft) and fastapi + uvicorn",
)

BASE = "tiny-base"


@pytest.fixture(autouse=True)
def _threads() -> None:
    import torch

    torch.set_num_threads(2)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.training.rl_toy import make_model

    path = tmp_path_factory.mktemp("remote") / "model"
    make_model(path)
    return path


@pytest.fixture
def servers(model_dir: Path) -> Iterator[list[Any]]:
    from tests.training.vllm_like_server import VLLMLikeServer

    running = [VLLMLikeServer(model_dir, BASE, seed=i) for i in range(2)]
    for server in running:
        server.start()
    yield running
    for server in running:
        server.stop()


def _config(tmp_path: Path, urls: list[str], rollouts: dict[str, Any] | None = None, **changes: Any) -> Any:
    from tapekit.training.config import LoraSettings
    from tapekit.training.rl import RLRunConfig

    values: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"),
        "steps": 2,
        "learning_rate": 3e-3,
        "seed": 1,
        "lora": LoraSettings(r=4, alpha=8),
        "checkpoint": False,
    }
    sampled = {"tasks_per_step": 3, "group_size": 4, "max_tokens": 12, "max_loops": 2}
    served = {"servers": urls, "served_model": BASE, "lora_name_prefix": "toy"}
    return RLRunConfig(**{**values, "rollouts": {**sampled, **served, **(rollouts or {})}, **changes})


def _calls(store: Any, tape: Any) -> list[Any]:
    ids = dict.fromkeys(s.metadata.prompt_id for s in tape.steps if s.metadata.prompt_id)
    return [store.get_llm_call(i) for i in ids]


def test_lora_rl_with_rollouts_on_two_vllm_like_servers(
    tmp_path: Path, model_dir: Path, servers: list[Any]
) -> None:
    from tapekit import open_store
    from tapekit.testing.tiny import load_tiny
    from tapekit.training.callbacks import StepCallback, StepRecord
    from tapekit.training.samples import make_samples
    from tests.training.rl_toy import make_setup

    model, tokenizer = load_tiny(model_dir)
    store = open_store(str(tmp_path / "rollouts.db"))
    config = _config(tmp_path, [s.url for s in servers])
    versions: dict[int, dict[str, Any]] = {}  # the trainer's LoRA weights of each version

    class Snapshot(StepCallback):
        def on_step(self, record: StepRecord) -> bool | None:  # record.step: the version just made
            lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
            versions[record.step] = lora
            return None

    result = train_rl_checked(make_setup(), model, tokenizer, config, store, callbacks=[Snapshot()])

    # every server loaded every version's adapter (v0 before step 0, ..., v2 after the last
    # step), in order, and unloaded those no longer used; the trained adapter changed
    for server in servers:
        loads = [e for e in server.events if e["event"] == "load"]
        assert [e["name"] for e in loads] == ["toy-v0", "toy-v1", "toy-v2"]
        assert [e["name"] for e in server.events if e["event"] == "unload"] == ["toy-v0", "toy-v1"]
        assert loads[0]["sha256"] != loads[-1]["sha256"]
        assert set(server.paths) == {"toy-v2"}  # the final policy stays served
    assert [e["sha256"] for e in servers[0].events if e["event"] == "load"] == [
        e["sha256"] for e in servers[1].events if e["event"] == "load"
    ]
    assert any("lora_B" in n and p.abs().sum() > 0 for n, p in model.named_parameters())
    assert any(not versions[1][n].equal(versions[2][n]) for n in versions[1])
    assert sorted(p.name for p in (tmp_path / "out" / "adapters").iterdir()) == ["v2"]
    assert [r.rollout_version for r in result.history] == [0, 1]
    assert any(r.tokens for r in result.history)

    # the rollouts' calls name the version's adapter and carry the ids each server sent back;
    # each tape stayed on one server, and both servers served tapes
    sent = [
        {(tuple(e["prompt_token_ids"]), tuple(e["token_ids"])): e for e in s.events if e["event"] == "chat"}
        for s in servers
    ]
    assert all(sent)
    for step in (0, 1):
        tapes = [store.get_tape(i) for i in store.list_tapes(where=TapeFilter(tag=f"rl:rl:step:{step}"))]
        assert len(tapes) == 12
        used = set()
        for tape in tapes:
            assert tape.metadata.result["policy_version"] == step
            calls = _calls(store, tape)
            assert calls
            where = set()
            for call in calls:
                assert call.model == f"toy-v{step}" and call.tokens.policy_version == str(step)
                key = (tuple(call.tokens.prompt_ids), tuple(call.tokens.output_ids))
                where |= {i for i, events in enumerate(sent) if key in events}
                server_event = next(events[key] for events in sent if key in events)
                assert server_event["model"] == f"toy-v{step}"
                assert call.tokens.output_logprobs == pytest.approx(server_event["logprobs"])
            assert len(where) == 1
            used |= where
        assert used == {0, 1}

        # the training rows are the ids the servers returned, with their log-probs
        rows = list(make_samples(tapes, llm_calls=store, tokenizer=tokenizer).dataset)
        assert rows and all(r["source"] == "ids" and r["has_logprobs"] for r in rows)
        returned = {k: e for events in sent for k, e in events.items()}
        full = {p + o: e for (p, o), e in returned.items()}
        for row in rows:
            event = full[tuple(row["input_ids"])]  # the row ends with the last call it merged
            n = len(event["token_ids"])
            assert row["logprobs"][-n:] == pytest.approx(event["logprobs"])
            assert row["loss_mask"][-n:] == [1] * n
    # the step-1 samples' log-probs are those of the trainer's version-1 weights (the adapter
    # the servers served), not of version 0's (a check that can fail: see the last line)
    calls = [
        c
        for i in store.list_tapes(where=TapeFilter(tag="rl:rl:step:1"))
        for c in _calls(store, store.get_tape(i))
    ]
    assert _max_logprob_gap(model, versions[1], calls) < 1e-4
    zero = {n: t.zero_() if "lora_B" in n else t for n, t in versions[1].items()}  # version 0: B = 0
    assert _max_logprob_gap(model, zero, calls) > 1e-3
    store.close()


def _max_logprob_gap(model: Any, weights: dict[str, Any], calls: list[Any]) -> float:
    """The largest gap between a call's sampling log-probs and ``weights``' log-probs."""
    import torch

    from tapekit.training.rl import token_logprobs

    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)
        gap = 0.0
        for call in calls:
            prompt, output = call.tokens.prompt_ids, call.tokens.output_ids
            x = torch.tensor([prompt + output])
            mine = token_logprobs(model(input_ids=x).logits, x, 1.0)[0, len(prompt) :]
            gap = max(gap, (mine - torch.tensor(call.tokens.output_logprobs)).abs().max().item())
    return gap


def train_rl_checked(setup: Any, model: Any, tokenizer: Any, config: Any, store: Any, **options: Any) -> Any:
    """``train_rl``, the run's records checked for lag 0 (the rollouts' version is the step)."""
    from tapekit.training.rl import train_rl

    result = train_rl(setup, model, tokenizer, config, store=store, **options)
    assert [r.policy_lag for r in result.history] == [0] * config.steps
    return result


def test_calls_without_token_ids_are_refused_not_retokenised(tmp_path: Path, model_dir: Path) -> None:
    from tapekit.errors import TrainingError
    from tapekit.testing.tiny import load_tiny
    from tests.training.rl_toy import make_setup
    from tests.training.vllm_like_server import VLLMLikeServer

    model, tokenizer = load_tiny(model_dir)
    with VLLMLikeServer(model_dir, BASE, token_ids=False) as old_server:
        config = _config(tmp_path, [old_server.url], steps=1)
        with pytest.raises(TrainingError, match=r"without token ids.*does not re-tokenise"):
            train_rl_checked(make_setup(), model, tokenizer, config, None)
        assert any(e["event"] == "chat" for e in old_server.events)  # the rollouts did run


def test_remote_rollouts_refuse_what_they_cannot_do(tmp_path: Path, model_dir: Path) -> None:
    from peft import get_peft_model

    from tapekit.errors import TrainingError
    from tapekit.testing.tiny import load_tiny
    from tapekit.training._hf import lora_config
    from tapekit.training.config import load_config
    from tapekit.training.rl import RLRunConfig, make_policy
    from tests.training.vllm_like_server import VLLMLikeServer

    (tmp_path / "rl.yaml").write_text(
        "rollouts:\n  servers: [http://a:8000/v1, http://b:8000/v1]\n  served_model: base\nlora: {r: 8}\n"
    )
    loaded = load_config(RLRunConfig, tmp_path / "rl.yaml").rollouts
    assert loaded.servers == ["http://a:8000/v1", "http://b:8000/v1"] and loaded.served_model == "base"
    model, tokenizer = load_tiny(model_dir)
    with pytest.raises(TrainingError, match="vLLM loads LoRA adapters at run time, not full weights"):
        make_policy(model, tokenizer, _config(tmp_path, ["http://127.0.0.1:9/v1"], lora=None))
    with pytest.raises(TrainingError, match="logprobs-mode processed_logprobs"):
        make_policy(model, tokenizer, _config(tmp_path, ["http://127.0.0.1:9/v1"], {"temperature": 0.7}))
    peft_model = get_peft_model(model, lora_config(_config(tmp_path, [])))
    with (
        VLLMLikeServer(model_dir, "other-model") as wrong,
        VLLMLikeServer(model_dir, BASE, runtime_lora=False) as fixed,
    ):
        policy = make_policy(peft_model, tokenizer, _config(tmp_path, [wrong.url]))
        with pytest.raises(TrainingError, match="does not serve base_model 'tiny-base'"):
            policy.publish(peft_model, 0)
        policy = make_policy(peft_model, tokenizer, _config(tmp_path, [fixed.url]))
        with pytest.raises(TrainingError, match=r"HTTP 404.*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            policy.publish(peft_model, 0)
    policy = make_policy(peft_model, tokenizer, _config(tmp_path, ["http://127.0.0.1:9/v1"]))
    with pytest.raises(TrainingError, match="cannot be reached"):
        policy.publish(peft_model, 0)


def test_async_remote_rollouts_record_the_version_each_server_served(
    tmp_path: Path, model_dir: Path, servers: list[Any]
) -> None:
    from tapekit import open_store
    from tapekit.testing.tiny import load_tiny
    from tapekit.training.rl import train_rl
    from tests.training.rl_toy import make_setup

    model, tokenizer = load_tiny(model_dir)
    store = open_store(str(tmp_path / "rollouts.db"))
    config = _config(tmp_path, [s.url for s in servers], steps=3, mode="async", max_staleness=1)
    result = train_rl(make_setup(), model, tokenizer, config, store=store)
    assert [r.step for r in result.history] == [1, 2, 3] and result.refused == 0
    assert all(0 <= r.policy_lag <= 1 and r.failed_rollouts == 0 for r in result.history)
    for server in servers:  # an adapter is unloaded only once no rollout uses it
        assert [e["name"] for e in server.events if e["event"] == "load"] == [f"toy-v{v}" for v in range(4)]
        assert set(server.paths) == {"toy-v3"}
    for record in result.history:
        version = record.rollout_version
        for i in store.list_tapes(where=TapeFilter(tag=f"rl:rl:step:{record.policy_version}")):
            tape = store.get_tape(i)
            assert tape.metadata.result["policy_version"] == version
            for call in _calls(store, tape):
                assert call.model == f"toy-v{version}" and call.tokens.policy_version == str(version)
    store.close()


def test_server_pool_sends_each_task_to_one_server_in_turn(model_dir: Path, servers: list[Any]) -> None:
    import asyncio

    from tapekit.core import Prompt
    from tapekit.llm import OpenAICompatibleLLM
    from tapekit.llm.server_pool import ServerPoolLLM

    pool = ServerPoolLLM(
        servers=[OpenAICompatibleLLM(model_name=BASE, base_url=s.url, return_tokens=True) for s in servers],
        model_name=BASE,
    )
    pool.serve(BASE, "7")

    async def session(n: int) -> list[Any]:
        prompts = [Prompt(messages=[{"role": "user", "content": f"What is {n}+{k}?"}]) for k in range(3)]
        return [[e async for e in pool.astream(p)][-1].tokens for p in prompts]

    async def main() -> list[list[Any]]:
        try:
            return list(await asyncio.gather(*(session(n) for n in range(4))))
        finally:
            await pool.aclose()

    sessions = asyncio.run(main())
    served = [{tuple(e["prompt_token_ids"]) for e in s.events if e["event"] == "chat"} for s in servers]
    homes = []
    for traces in sessions:
        assert all(t is not None and t.policy_version == "7" for t in traces)
        where = {i for t in traces for i, ids in enumerate(served) if tuple(t.prompt_ids) in ids}
        assert len(where) == 1  # every call of one task on one server
        homes.append(where.pop())
    assert sorted(homes) == [0, 0, 1, 1]  # tasks in turn
