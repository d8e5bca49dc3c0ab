#!/bin/bash
# The lr5e6 arm, seeds 0-2, each resumed after a kill (up to 20 times a seed).
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export MALLOC_ARENA_MAX=2
export MALLOC_MMAP_THRESHOLD_=1048576  # tensors over 1 MB mmapped: returned to the system when freed
RUN=docs/experiments/web-teacherless/run
for s in ${SEEDS:-0 1 2}; do  # SEEDS="1 2" bash chain-lr5e6.sh: the seeds still to run
  mkdir -p $RUN/rl-lr5e6-seed$s
  for a in $(seq 1 20); do
    echo "== chain: seed $s attempt $a $(date -u +%FT%TZ)" >> $RUN/rl-lr5e6-seed$s/stdout.log
    MEMDEBUG_OUT=$RUN/rl-lr5e6-seed$s/memdebug.jsonl python docs/experiments/web-teacherless/memdebug.py rl --arm lr5e6 --lr 5e-6 --temperature 0.7 --eval-every 20 --seed $s --out $RUN >> $RUN/rl-lr5e6-seed$s/stdout.log 2>&1 && break
    echo "== chain: seed $s attempt $a exited $? $(date -u +%FT%TZ)" >> $RUN/rl-lr5e6-seed$s/stdout.log
  done
done
