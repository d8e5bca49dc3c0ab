"""The quick-setting probes of docs/experiments/web-training.md ("Does GRPO move the quick
task?"): one ``sft_rl`` run on click-button, scored greedily on its 8 RL pool seeds.

    python docs/experiments/web-training/quick_pool_try.py '{"rl_lr": 1e-4}' /tmp/out
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from examples.web_agent import study

settings = study.Settings(
    arm="sft_rl",
    tasks=[study.QUICK_TASK],
    teacher_seeds=4,
    rl_seeds=8,
    val_seeds=0,
    checkpoints=2,
    tasks_per_step=2,
    group_size=8,
    pool_eval=True,
    threads=1,
    out=sys.argv[2],
)
for key, value in json.loads(sys.argv[1]).items():
    setattr(settings, key, value)
began = time.time()
results = study.run_arm(settings)
points = [(c["label"], c["seconds"], c["pool"]["success"]) for c in results["checkpoints"]]
print("WALL", round(time.time() - began), json.dumps(points))
