"""Rollout policies: where the RL loop samples its rollouts, and how each new version gets there.

The trainer :meth:`~RolloutPolicy.publish` es every version of the policy it makes (once
before the first step, then after every step); the rollout side :meth:`~RolloutPolicy.activate`
s the newest published version before a step's rollouts and learns which version that is, so
each rollout tape and LLM call records the version that really sampled it.

- :class:`LocalPolicy`: in-process, a :class:`~tapekit.llm.batched.BatchedTransformersLLM`
  on the trained model itself (sync runs) or on a copy that loads each published state dict
  (asynchronous runs).
- :class:`RemotePolicy`: OpenAI-compatible servers (vLLM) serving the base model with dynamic
  LoRA. Publishing saves the adapter (peft ``save_pretrained``) to ``adapter_dir/v<version>``
  and POSTs ``/v1/load_lora_adapter`` to every server; rollouts then ask for the model
  ``<prefix>-v<version>``, each tape on one server (round robin), with token ids and sampling
  log-probabilities returned by the server (``return_token_ids``, ``logprobs``). Adapters that
  neither the rollouts use nor are the newest are unloaded (``/v1/unload_lora_adapter``) and
  their directories removed.

- :class:`LlamaCppPolicy`: in-process llama.cpp. A LoRA run keeps the quantised base GGUF
  (default: the embedded SmolLM2) and converts each version's adapter to a GGUF adapter
  (:func:`~tapekit.llm.gguf_lora.export_lora_gguf`, ``adapter_dir/v<version>.gguf``); a full
  fine-tune writes each version as a whole model file in ``quantization`` (default q8_0;
  :func:`~tapekit.llm.gguf_model.export_model_gguf`, the same path). llama.cpp records each
  sampled token's log-prob, so the importance ratio corrects for the engine difference (its
  quantised arithmetic against the fp32 trainer). The previous version's file is removed once
  the next one is active.

vLLM reloads LoRA adapters at run time, not full weights (its weight-transfer API needs NCCL or
CUDA IPC between trainer and server), so a remote policy needs a LoRA run.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import threading
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tapekit.errors import TrainingError
from tapekit.llm._http import env_proxy
from tapekit.llm.openai_compat import OpenAICompatibleLLM
from tapekit.llm.server_pool import ServerPoolLLM
from tapekit.training.rl._config import RLRunConfig

if TYPE_CHECKING:
    from tapekit.llm.gguf_model import Quantization


class RolloutPolicy(ABC):
    """Where rollouts are sampled: ``llm`` (what the agents call) and ``batcher`` (a lockstep
    :class:`~tapekit.llm.batched.RequestBatcher`, or None)."""

    llm: Any
    batcher: Any = None

    @abstractmethod
    def publish(self, model: Any, version: int) -> None:
        """Make ``model``'s current weights available as ``version`` (trainer side)."""

    @abstractmethod
    def activate(self) -> int:
        """Sample from the newest published version from now on; return that version."""

    def close(self) -> None:  # noqa: B027 - optional: most policies hold nothing
        """Release what the policy holds (nothing by default)."""


class LocalPolicy(RolloutPolicy):
    """Rollouts in this process on a batched ``generate``; ``copy=True`` samples from a copy
    of the model that loads each published state dict (the trained model is left alone)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        temperature: float,
        max_tokens: int,
        copy_model: bool = False,
        share_prompts: bool = True,
    ) -> None:
        from tapekit.llm.batched import BatchedTransformersLLM

        self.copy_model = copy_model
        self.actor = copy.deepcopy(model).eval() if copy_model else model
        self.llm = BatchedTransformersLLM.from_model(
            self.actor,
            tokenizer,
            model_name="rl-policy",
            temperature=temperature,
            max_tokens=max_tokens,
            share_prompts=share_prompts,
        )
        self.batcher = self.llm.batcher
        self._lock = threading.Lock()
        self._pending: tuple[int, dict[str, Any] | None] | None = None
        self._version = 0

    def publish(self, model: Any, version: int) -> None:
        """Record the version (and, for a copy, a snapshot of the weights)."""
        weights = None
        if self.copy_model:
            weights = {n: t.detach().clone() for n, t in model.state_dict().items()}
        with self._lock:
            self._pending = (version, weights)

    def activate(self) -> int:
        """Load the newest snapshot into the copy (if any) and return its version."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            version, weights = pending
            if weights is not None:
                self.actor.load_state_dict(weights)
            self._version = version
        self.actor.eval()
        self.llm.policy_version = str(self._version)
        return self._version


class LlamaCppPolicy(RolloutPolicy):
    """Rollouts in this process through llama.cpp with the newest version of the policy.

    ``base_gguf``: the GGUF file the trained model's base weights came from (None: the embedded
    SmolLM2). A LoRA model is published as a GGUF adapter on that base; any other model as a
    whole GGUF model file in ``quantization`` (``"q8_0"``, ``"f16"`` or ``"f32"``), with the
    base file's tokenizer and metadata. Sampling is plain: ``temperature``, no
    top-k/top-p/min-p, no repeat penalty, so the sampler draws from the distribution the
    trainer's ratio assumes. One llama.cpp context decodes one sequence at a time (the
    episodes' calls queue); ``n_threads`` decode it.
    """

    def __init__(
        self,
        base_gguf: str | None,
        adapter_dir: str | Path,
        *,
        temperature: float,
        max_tokens: int,
        n_threads: int | None = None,
        seed: int = 0,
        quantization: Quantization = "q8_0",
    ) -> None:
        from tapekit.llm.gguf_lora import read_gguf_base
        from tapekit.llm.llamacpp import smollm2_path

        if quantization not in ("q8_0", "f16", "f32"):
            raise TrainingError(f"LlamaCppPolicy: quantization {quantization!r} is not q8_0, f16 or f32")
        self.base_gguf = str(base_gguf or smollm2_path())
        self.base = read_gguf_base(self.base_gguf)
        self.adapter_dir = Path(adapter_dir)
        self.adapter_dir.mkdir(parents=True, exist_ok=True)
        self.parameters = {
            "temperature": temperature,
            "max_tokens": max_tokens,
            "top_k": 0,
            "top_p": 1.0,
            "min_p": 0.0,
            "repeat_penalty": 1.0,
        }
        self.n_threads, self.seed, self.quantization = n_threads, seed, quantization
        self.llm: Any = None
        self._lock = threading.Lock()
        self._pending: tuple[int, Path, bool] | None = None
        self._version = 0
        self._path: Path | None = None

    def publish(self, model: Any, version: int) -> None:
        """Write ``model`` to ``adapter_dir/v<version>.gguf``: its LoRA weights as a GGUF
        adapter, or (no LoRA) the whole model in ``quantization``."""
        from tapekit.llm.gguf_lora import export_lora_gguf
        from tapekit.llm.gguf_model import export_model_gguf

        path = self.adapter_dir / f"v{version}.gguf"
        adapter = hasattr(model, "peft_config")
        try:
            if adapter:
                path = export_lora_gguf(model, self.base, path)
            else:
                path = export_model_gguf(model, self.base_gguf, path, self.quantization)
        except ValueError as e:
            what = "adapter" if adapter else "weights"
            raise TrainingError(f"the policy's {what} cannot run in llama.cpp: {e}") from e
        with self._lock:
            stale, self._pending = self._pending, (version, path, adapter)
        if stale is not None and stale[1] != path:  # published, never activated
            stale[1].unlink(missing_ok=True)

    def activate(self) -> int:
        """Load the newest version (a new llama.cpp model: the base with its adapter, or its
        own model file) and return its version."""
        from tapekit.llm.llamacpp import LlamaCppLLM

        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            version, path, adapter = pending
            llm = LlamaCppLLM(
                model_name="rl-policy",
                model_path=self.base_gguf if adapter else str(path),
                lora_path=str(path) if adapter else None,
                policy_version=str(version),
                n_threads=self.n_threads,
                seed=self.seed * 1_000_003 + version,
                parameters=dict(self.parameters),
            )
            llm.load()
            old, old_path = self.llm, self._path
            self.llm, self._path, self._version = llm, path, version
            if old is not None:
                old.close()
            if old_path is not None and old_path != path:
                old_path.unlink(missing_ok=True)
        if self.llm is None:
            raise TrainingError("LlamaCppPolicy.activate before any version was published")
        return self._version

    def close(self) -> None:
        """Free the llama.cpp model; only the newest published adapter file stays."""
        if self.llm is not None:
            self.llm.close()
        with self._lock:
            pending = self._pending
        if pending is not None and self._path is not None and self._path != pending[1]:
            self._path.unlink(missing_ok=True)


def _post(url: str, body: dict[str, Any] | None, api_key: str | None, timeout_s: float) -> tuple[int, str]:
    """One JSON request (GET when ``body`` is None): the status and the response text."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    proxy = env_proxy(parts.scheme, parts.hostname or "")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({parts.scheme: proxy} if proxy else {}))
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, headers=headers, method="GET" if body is None else "POST"
    )
    try:
        with opener.open(request, timeout=timeout_s) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        raise TrainingError(f"{url} cannot be reached: {getattr(e, 'reason', e)}") from e


_LORA_HINT = (
    " (vLLM serves these endpoints only when started with --enable-lora and the environment "
    "variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
)


class RemotePolicy(RolloutPolicy):
    """Rollouts on OpenAI-compatible servers (vLLM) that load each published LoRA adapter.

    ``base_urls``: the servers' ``/v1`` URLs; ``base_model``: the model they serve (checked in
    ``/v1/models`` before the first load); ``adapter_dir``: where adapters are saved (a path the
    servers can read: the same file system); ``lora_name_prefix``: adapters are served as
    ``<prefix>-v<version>``. ``tokenizer`` is the training tokenizer: its fingerprint names the
    servers' token ids (they must use the same tokenizer and chat template). ``temperature``
    and ``max_tokens`` are sent with every call; ``api_key`` (default ``$OPENAI_API_KEY``, if
    set) with every request.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        base_model: str,
        adapter_dir: str | Path,
        lora_name_prefix: str = "tapekit-rl",
        *,
        tokenizer: Any,
        temperature: float = 1.0,
        max_tokens: int = 64,
        api_key: str | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        if not base_urls:
            raise ValueError("RemotePolicy needs at least one server URL (base_urls)")
        if not base_model:
            raise ValueError("RemotePolicy needs base_model: the model the servers serve")
        from tapekit.training._chat_tokenizer import ChatTokenizer

        self.base_urls = [u.rstrip("/") for u in base_urls]
        self.base_model = base_model
        self.adapter_dir = Path(adapter_dir)
        self.prefix = lora_name_prefix
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or None
        self.timeout_s = timeout_s
        fingerprint = ChatTokenizer(tokenizer).fingerprint()
        parameters = {"temperature": temperature, "max_tokens": max_tokens}
        servers = [
            OpenAICompatibleLLM(
                model_name=base_model,
                base_url=url,
                api_key=api_key,
                parameters=parameters,
                return_tokens=True,
                tokenizer=fingerprint,
                timeout_s=timeout_s,
            )
            for url in self.base_urls
        ]
        self.llm = ServerPoolLLM(servers=servers, model_name=base_model)
        self.loaded: list[int] = []  # versions loaded on every server, oldest first
        self._latest: int | None = None
        self._active: int | None = None
        self._checked = False
        self._lock = threading.Lock()

    def lora_name(self, version: int) -> str:
        """The name the servers serve ``version``'s adapter under."""
        return f"{self.prefix}-v{version}"

    def check_servers(self) -> None:
        """Every server answers ``/v1/models`` and lists ``base_model``."""
        for url in self.base_urls:
            status, text = _post(url + "/models", None, self.api_key, self.timeout_s)
            if status != 200:
                raise TrainingError(f"{url}/models answered HTTP {status}: {text[:300]}")
            try:
                served = [m.get("id") for m in json.loads(text).get("data", [])]
            except (ValueError, AttributeError) as e:
                raise TrainingError(f"{url}/models did not answer a model list: {text[:300]}") from e
            if self.base_model not in served:
                raise TrainingError(
                    f"{url} does not serve base_model {self.base_model!r} (it serves {served}): "
                    "start it on the model being trained, or set served_model to its name"
                )
        self._checked = True

    def publish(self, model: Any, version: int) -> None:
        """Save ``model``'s adapter to ``adapter_dir/v<version>`` and load it on every server."""
        if not hasattr(model, "peft_config"):
            raise TrainingError(
                "RemotePolicy publishes LoRA adapters (vLLM loads adapters at run time, not full "
                "weights): train with lora set, or roll out in-process"
            )
        if not self._checked:
            self.check_servers()
        path = (self.adapter_dir / f"v{version}").resolve()
        model.save_pretrained(str(path))
        name = self.lora_name(version)
        for url in self.base_urls:
            self._load(url, name, path)
        with self._lock:
            if version not in self.loaded:
                self.loaded.append(version)
            self._latest = version
            retired = self._retired()
        self._unload(retired)

    def activate(self) -> int:
        """Sample from the newest loaded adapter; return its version."""
        with self._lock:
            if self._latest is None:
                raise TrainingError("RemotePolicy.activate: nothing was published yet")
            self._active = self._latest
            retired = self._retired()
        self.llm.serve(self.lora_name(self._active), str(self._active))
        self._unload(retired)
        return self._active

    def close(self) -> None:
        """Unload every adapter but the newest (the servers keep serving the final policy)."""
        with self._lock:
            self._active = self._latest
            retired = self._retired()
        self._unload(retired)

    def _load(self, url: str, name: str, path: Path) -> None:
        body = {"lora_name": name, "lora_path": str(path)}
        status, text = _post(f"{url}/load_lora_adapter", body, self.api_key, self.timeout_s)
        if status == 400 and "already" in text.lower():  # left by an earlier try (a resumed run)
            self._unload_request(url, name)
            status, text = _post(f"{url}/load_lora_adapter", body, self.api_key, self.timeout_s)
        if status != 200:
            raise TrainingError(
                f"{url}/load_lora_adapter answered HTTP {status} to load {name!r}: {text[:300]}"
                + (_LORA_HINT if status in (404, 405) else "")
            )

    def _retired(self) -> list[int]:
        keep = {self._latest, self._active}
        retired = [v for v in self.loaded if v not in keep]
        self.loaded = [v for v in self.loaded if v in keep]
        return retired

    def _unload(self, versions: list[int]) -> None:
        for version in versions:
            self._unload_one(version, remove=True)

    def _unload_one(self, version: int, remove: bool) -> None:
        for url in self.base_urls:
            self._unload_request(url, self.lora_name(version))
        if remove:
            shutil.rmtree(self.adapter_dir / f"v{version}", ignore_errors=True)

    def _unload_request(self, url: str, name: str) -> None:
        status, text = _post(f"{url}/unload_lora_adapter", {"lora_name": name}, self.api_key, self.timeout_s)
        if status != 200:
            raise TrainingError(
                f"{url}/unload_lora_adapter answered HTTP {status} to unload {name!r}: {text[:300]}"
            )


def make_policy(
    model: Any, tokenizer: Any, config: RLRunConfig, *, copy_model: bool = False
) -> RolloutPolicy:
    """The rollout policy that an :class:`~tapekit.training.rl.RLRunConfig`'s ``rollouts`` ask for:
    llama.cpp, or remote when ``servers`` are set, else in-process (``copy_model`` for async runs)."""
    rollouts = config.rollouts
    adapter_dir = rollouts.adapter_dir or str(Path(config.output_dir) / "adapters")
    if rollouts.engine == "llamacpp":
        if rollouts.servers:
            raise TrainingError("rollouts.engine llamacpp samples in this process: drop rollouts.servers")
        return LlamaCppPolicy(
            rollouts.gguf,
            adapter_dir,
            temperature=rollouts.temperature,
            max_tokens=rollouts.max_tokens,
            n_threads=rollouts.threads,
            seed=config.seed,
            quantization=rollouts.gguf_quantization,
        )
    if not rollouts.servers:
        return LocalPolicy(
            model,
            tokenizer,
            temperature=rollouts.temperature,
            max_tokens=rollouts.max_tokens,
            copy_model=copy_model,
            share_prompts=rollouts.share_prompts,
        )
    if config.lora is None:
        raise TrainingError(
            "rollouts.servers needs a LoRA run (set lora): vLLM loads LoRA adapters at run time, "
            "not full weights, so a fully fine-tuned policy cannot be published to it"
        )
    if rollouts.served_model is None:
        raise TrainingError(
            "rollouts.servers needs rollouts.served_model: the base model name the servers serve"
        )
    if rollouts.temperature != 1.0 and rollouts.logprobs != "processed":
        raise TrainingError(
            f"temperature {rollouts.temperature} with rollout servers: vLLM returns the log-probs of the "
            "raw model by default (temperature 1), not of the distribution it sampled from; start it "
            "with --logprobs-mode processed_logprobs and set rollouts.logprobs: processed, or use "
            "temperature 1.0"
        )
    return RemotePolicy(
        rollouts.servers,
        rollouts.served_model,
        adapter_dir,
        rollouts.lora_name_prefix or config.run_name,
        tokenizer=tokenizer,
        temperature=rollouts.temperature,
        max_tokens=rollouts.max_tokens,
    )
