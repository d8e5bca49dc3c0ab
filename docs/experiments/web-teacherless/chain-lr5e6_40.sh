#!/bin/bash
# The lr5e6_40 arm (docs/experiments/web-teacherless.md): for each seed, GRPO (40 updates,
# journaled; resumed after a kill, up to 20 times), its T = 1 validation probe, then `test` of
# every finished policy not yet tested (the student with the first seed). Run it again to go on
# from wherever it stopped: a finished stage is skipped, a lost machine is rebuilt from the
# committed journal (after the student is rebuilt).
cd "$(dirname "$0")/../../.." && source .venv/bin/activate
export MALLOC_ARENA_MAX=2
RUN=docs/experiments/web-teacherless/run
ARM=lr5e6_40
STUDY="python examples/web_agent/teacherless.py"
# on a new machine the student is rebuilt first (skipped when it is there; it reproduced bit for
# bit on 2026-11-30, and each run refuses a student other than the one it started from)
$STUDY sft --new-student --out $RUN >> /tmp/teacherless-sft.log 2>&1 || exit 1
for s in ${SEEDS:-0 1 2}; do
  dir=$RUN/rl-$ARM-seed$s
  mkdir -p $dir
  python -c "import json,sys; sys.exit(0 if 'sampled' in json.load(open('$RUN/test.json')).get('rl-$ARM-seed$s', {}) else 1)" \
    2>/dev/null && continue  # tested: nothing of this seed is needed any more
  for a in $(seq 1 20); do
    [ -f $dir/final/config.json ] && break
    echo "== chain: seed $s attempt $a $(date -u +%FT%TZ)" >> $dir/stdout.log
    $STUDY rl --arm $ARM --lr 5e-6 --temperature 0.7 --steps 40 --eval-every 20 --seed $s --out $RUN >> $dir/stdout.log 2>&1 && break
    echo "== chain: seed $s attempt $a exited $? $(date -u +%FT%TZ)" >> $dir/stdout.log
  done
  [ -f $dir/final/config.json ] || exit 1
  grep -q "\"policy\": \"rl-$ARM-seed$s\"" $RUN/probe.jsonl || \
    $STUDY probe --policy rl-$ARM-seed$s --probe-temperature 1 --out $RUN >> $dir/stdout.log 2>&1 || exit 1
  $STUDY test --out $RUN >> $RUN/test.log 2>&1 || exit 1
done
