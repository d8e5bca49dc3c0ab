"""The LLM backends are importable from ``tapekit.llm`` and from ``tapekit``, loaded lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

BACKENDS = {
    "OpenAICompatibleLLM": "tapekit.llm.openai_compat",
    "LlamaCppLLM": "tapekit.llm.llamacpp",
    "TransformersLLM": "tapekit.llm.transformers",
    "LiteLLM": "tapekit.llm.litellm",
}


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_a_backend_imports_from_the_llm_package_and_the_root(name: str) -> None:
    code = (
        "import sys, tapekit, tapekit.llm\n"
        f"assert {BACKENDS[name]!r} not in sys.modules, 'loaded eagerly'\n"
        f"from tapekit.llm import {name} as a\n"
        f"from tapekit import {name} as b\n"
        f"from {BACKENDS[name]} import {name} as c\n"
        "assert a is b is c\n"
        f"assert {name!r} in dir(tapekit) and {name!r} in dir(tapekit.llm)\n"
        f"assert {name!r} in tapekit.__all__ and {name!r} in tapekit.llm.__all__\n"
        "heavy = {'torch', 'transformers', 'litellm', 'llama_cpp', 'aiohttp'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"  # naming a backend does not load its dependencies


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    import tapekit
    import tapekit.llm

    with pytest.raises(AttributeError, match="has no attribute 'NoSuchLLM'"):
        tapekit.llm.NoSuchLLM  # noqa: B018
    with pytest.raises(ImportError):
        from tapekit import NoSuchLLM  # noqa: F401


@pytest.mark.parametrize(
    "name, module",
    [("BatchedTransformersLLM", "tapekit.llm.batched"), ("ServerPoolLLM", "tapekit.llm.server_pool")],
)
def test_the_rl_rollout_backends_live_in_the_llm_package_not_in_training(name: str, module: str) -> None:
    code = (
        "import sys, tapekit.llm, tapekit.training\n"
        f"assert {module!r} not in sys.modules, 'loaded eagerly'\n"
        f"from tapekit.llm import {name} as a\n"
        f"from {module} import {name} as b\n"
        f"assert a is b and {name!r} in tapekit.llm.__all__ and {name!r} in dir(tapekit.llm)\n"
        f"assert {name!r} not in tapekit.training.__all__ and not hasattr(tapekit.training, {name!r})\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
