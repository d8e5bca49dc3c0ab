"""The fixed-student probes of docs/experiments/web-training.md: ``study.py --quick`` (SFT and
GRPO counted in steps) with some settings changed, one run per call.

    python docs/experiments/web-training/quick_steps_try.py '{"rl_lr": 5e-5, "seed": 1}' /tmp/out
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from examples.web_agent import study

settings = study.parse_args(["--quick", "--arm", "sft_rl", "--out", sys.argv[2]])
for key, value in json.loads(sys.argv[1]).items():
    setattr(settings, key, value)
began = time.time()
results = study.run_arm(settings)
points = [(c["label"], c["seconds"], c["pool"]["success"]) for c in results["checkpoints"]]
print("WALL", round(time.time() - began), json.dumps(points), json.dumps(results.get("rl_sampled", {})))
