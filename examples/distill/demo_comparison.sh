#!/usr/bin/env bash
# On-policy distillation against SFT on the teacher's samples, on the embedded demo (issue 45; figures in
# docs/results.md).
#
# From a finished `make demo` run (runs/demo/posttrain-all-*), with its GRPO model as the teacher: a student
# of at most half the teacher's parameters with the teacher's tokenizer, SFT-trained on the demo's SFT data
# at the demo's SFT settings; then arm A, `posttrain distill` on the demo's 200 RL code prompts, and arm B,
# `posttrain sft` on the teacher's samples of the same prompts at the same sequences per step and steps;
# `posttrain evaluate` gives the held-out task pass rate of student, both arms and teacher. Prints a
# markdown table; OUT/report.json holds figures, settings and times (trainer_lib/demo/distill_demo.py).
#
#   examples/distill/demo_comparison.sh DEMO_RUN [OUT=runs/distill-demo/seed-SEED] [SEED=0] [--lr 1e-4 ...]
#
# Words after SEED go to the driver (python -m trainer_lib.demo.distill_demo --help): --steps (100), --lr,
# --n (1), --prompts-per-step (32), --temperature, --beta, --lmbda, --student DIR, --student-shape,
# --student-steps, --student-lr, --samples (8). Exits 1 when arm A's pass rate over the sampled answers
# is under arm B's + 0.05. One torch thread unless OMP_NUM_THREADS says otherwise (the tiny model's ops
# are too small to split on 2 busy cores).
set -euo pipefail
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
RUN=${1:?usage: demo_comparison.sh DEMO_RUN [OUT] [SEED] [driver options]}
SEED=${3:-0}
OUT=${2:-runs/distill-demo/seed-$SEED}
shift $(($# < 3 ? $# : 3))
[ -f "$RUN/bootstrap/demo/rl_prompts.jsonl" ] || { echo "error: $RUN is not a finished make demo run" >&2; exit 2; }
exec "$BIN/python" -m trainer_lib.demo.distill_demo "$RUN" --out "$OUT" --seed "$SEED" "$@"
