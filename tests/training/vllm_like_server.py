"""A vLLM-like OpenAI-compatible server for tests: a real HTTP server (FastAPI on uvicorn, in a
thread on 127.0.0.1) over a local tiny model, speaking the subset of vLLM's protocol that RL
rollouts use.

- ``POST /v1/chat/completions``: the chat template applied (``add_generation_prompt``), tokens
  sampled one by one at the request's ``temperature`` up to ``max_tokens`` or the end-of-turn
  token (kept in ``token_ids``, left out of the text, as vLLM does); streamed as
  ``chat.completion.chunk`` events (``prompt_token_ids`` on the first chunk, ``token_ids`` and
  ``logprobs.content`` on each choice delta, ``usage`` last when ``stream_options.include_usage``)
  or answered whole (``choices[0].message``, ``choices[0].token_ids``, ``prompt_token_ids``).
  Ids are sent only when ``return_token_ids`` is true (``token_ids=False`` plays an older vLLM
  that ignores it). ``logprobs_mode`` ``"processed"`` reports the log-probs of the distribution
  sampled from, ``"raw"`` those of the unscaled model (vLLM's default).
- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path"}``: a peft adapter directory,
  merged into a copy of the base model and served under ``lora_name``; ``POST
  /v1/unload_lora_adapter`` ``{"lora_name"}``. Absent (404) with ``runtime_lora=False``.
- ``GET /v1/models``: the base model and the loaded adapters.

Every request is recorded in ``events`` (loads with the adapter file's sha256, completions with
the model name and the ids sent back) for the tests to check.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

__all__ = ["VLLMLikeServer"]


class VLLMLikeServer:
    """One server on the tiny model saved at ``model_dir``, served as ``served_name``."""

    def __init__(
        self,
        model_dir: str | Path,
        served_name: str,
        *,
        seed: int = 0,
        logprobs_mode: str = "processed",
        runtime_lora: bool = True,
        token_ids: bool = True,
    ) -> None:
        import torch

        from tapekit.testing.tiny import load_tiny

        self.base, self.tokenizer = load_tiny(model_dir)
        self.served_name = served_name
        self.models: dict[str, Any] = {served_name: self.base}
        self.paths: dict[str, str] = {}
        self.logprobs_mode = logprobs_mode
        self.runtime_lora = runtime_lora
        self.token_ids = token_ids
        self.events: list[dict[str, Any]] = []
        self.generator = torch.Generator().manual_seed(seed)
        self.lock = threading.Lock()
        self.app = self._make_app()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> str:
        """Serve on a free port; returns the ``/v1`` URL."""
        import uvicorn

        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="vllm-like-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the vLLM-like server did not start")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self.url

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> VLLMLikeServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ the app

    def _make_app(self) -> Any:
        app = FastAPI()

        @app.get("/v1/models")
        def models() -> Any:
            data = [{"id": self.served_name, "object": "model", "owned_by": "vllm", "root": self.served_name}]
            data += [
                {"id": n, "object": "model", "owned_by": "vllm", "root": p, "parent": self.served_name}
                for n, p in self.paths.items()
            ]
            return {"object": "list", "data": data}

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            name = body.get("model")
            if name not in self.models:
                return _error(f"The model `{name}` does not exist.", "NotFoundError", 404)
            result = await _in_thread(self._complete, body)
            if body.get("stream"):
                return StreamingResponse(self._chunks(body, result), media_type="text/event-stream")
            return JSONResponse(self._whole(body, result))

        if self.runtime_lora:

            @app.post("/v1/load_lora_adapter")
            async def load(request: Request) -> Any:
                body = await request.json()
                name, path = body.get("lora_name"), body.get("lora_path")
                if not name or not path:
                    return _error(
                        "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", 400
                    )
                if name in self.models:
                    return _error(
                        f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput", 400
                    )
                if not (Path(path) / "adapter_config.json").is_file():
                    return _error(f"No adapter found at {path}.", "NotFoundError", 404)
                digest = await _in_thread(self._load, name, path)
                self.events.append({"event": "load", "name": name, "path": path, "sha256": digest})
                return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

            @app.post("/v1/unload_lora_adapter")
            async def unload(request: Request) -> Any:
                name = (await request.json()).get("lora_name")
                if name not in self.paths:
                    return _error(f"The lora adapter '{name}' cannot be found.", "NotFoundError", 404)
                with self.lock:
                    del self.models[name], self.paths[name]
                self.events.append({"event": "unload", "name": name})
                return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

        return app

    def _load(self, name: str, path: str) -> str:
        from peft import PeftModel

        merged = PeftModel.from_pretrained(copy.deepcopy(self.base), path).merge_and_unload().eval()
        digest = hashlib.sha256((Path(path) / "adapter_model.safetensors").read_bytes()).hexdigest()
        with self.lock:
            self.models[name], self.paths[name] = merged, path
        return digest

    # ------------------------------------------------------------------ sampling

    def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        """Sample one completion: prompt ids, output ids, their log-probs, finish reason."""
        import torch

        messages = [{**m, "content": m.get("content") or ""} for m in body.get("messages", [])]
        prompt = [
            int(i) for i in _ids(self.tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        ]
        temperature = float(body.get("temperature", 1.0))
        limit = int(body.get("max_tokens") or 16)
        eos = self.tokenizer.eos_token_id
        ids: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        with self.lock, torch.no_grad():
            model = self.models[body["model"]]
            out = model(input_ids=torch.tensor([prompt]), use_cache=True)
            for _ in range(limit):
                logits = out.logits[0, -1].float()
                processed = torch.log_softmax(logits / max(temperature, 1e-6), -1)
                token = int(torch.multinomial(processed.exp(), 1, generator=self.generator))
                reported = processed if self.logprobs_mode == "processed" else torch.log_softmax(logits, -1)
                ids.append(token)
                logprobs.append(float(reported[token]))
                if token == eos:
                    finish = "stop"
                    break
                out = model(
                    input_ids=torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True
                )
        event = {
            "event": "chat",
            "model": body["model"],
            "prompt_token_ids": prompt,
            "token_ids": ids,
            "logprobs": logprobs,
        }
        self.events.append(event)
        return {"prompt": prompt, "ids": ids, "logprobs": logprobs, "finish": finish}

    def _text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _entries(self, ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
        entries = []
        for token, logprob in zip(ids, logprobs, strict=True):
            text = self.tokenizer.convert_ids_to_tokens(token)
            entries.append(
                {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}
            )
        return entries

    def _whole(self, body: dict[str, Any], r: dict[str, Any]) -> dict[str, Any]:
        want_ids = self.token_ids and body.get("return_token_ids")
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": self._text(r["ids"])},
            "finish_reason": r["finish"],
            "logprobs": {"content": self._entries(r["ids"], r["logprobs"])} if body.get("logprobs") else None,
        }
        if want_ids:
            choice["token_ids"] = r["ids"]
        answer: dict[str, Any] = {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [choice],
            "usage": _usage(r),
        }
        if want_ids:
            answer["prompt_token_ids"] = r["prompt"]
        return answer

    def _chunks(self, body: dict[str, Any], r: dict[str, Any]) -> Iterator[str]:
        want_ids = self.token_ids and body.get("return_token_ids")
        base = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": body["model"],
        }
        first: dict[str, Any] = {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        if want_ids:
            first["prompt_token_ids"] = r["prompt"]
        yield _sse(first)
        ids, logprobs = r["ids"], r["logprobs"]
        final, sent = self._text(ids), 0
        for i, token in enumerate(ids):
            last = i == len(ids) - 1
            # the text that is settled so far (a character split over tokens waits for its end)
            upto = len(final) if last else _common_prefix(final, self._text(ids[: i + 1]))
            piece, sent = final[sent:upto], max(sent, upto)
            choice: dict[str, Any] = {
                "index": 0,
                "delta": {"content": piece},
                "logprobs": {"content": self._entries([token], [logprobs[i]])}
                if body.get("logprobs")
                else None,
                "finish_reason": r["finish"] if last else None,
            }
            if want_ids:
                choice["token_ids"] = [token]
            yield _sse({**base, "choices": [choice]})
        if (body.get("stream_options") or {}).get("include_usage"):
            yield _sse({**base, "choices": [], "usage": _usage(r)})
        yield "data: [DONE]\n\n"


def _ids(rendered: Any) -> list[int]:
    """apply_chat_template's ids (a list, or a BatchEncoding in newer transformers)."""
    if isinstance(rendered, dict) or hasattr(rendered, "input_ids"):
        rendered = rendered["input_ids"]
    return list(rendered)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _usage(r: dict[str, Any]) -> dict[str, int]:
    return {
        "prompt_tokens": len(r["prompt"]),
        "completion_tokens": len(r["ids"]),
        "total_tokens": len(r["prompt"]) + len(r["ids"]),
    }


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def _error(message: str, kind: str, code: int) -> Any:
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": code}
    return JSONResponse(body, status_code=code)


async def _in_thread(fn: Any, *args: Any) -> Any:
    import asyncio

    return await asyncio.to_thread(fn, *args)
