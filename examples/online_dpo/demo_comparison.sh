#!/usr/bin/env bash
# Online DPO against offline DPO on the demo's safety prompts (issue 45; figures in docs/results.md).
#
# From a finished `make demo` run (runs/demo/posttrain-all-*): an SFT model trained at the demo's SFT settings
# on the demo's SFT data plus a few refusals of harmful training prompts (so that its samples sometimes
# refuse); then offline DPO (the demo's settings, its preference pairs) and `posttrain online-dpo` (the safety
# prompts, 24 a step, judged by a reward function comparing each sample's words with the pair's two answers)
# from the same SFT model at equal steps; `posttrain evaluate` scores the three with the demo's refusal
# rules, which no model here was trained against. Prints a markdown table; OUT/report.json holds figures,
# settings and times (trainer_lib/demo/online_dpo_demo.py). About 7 minutes a seed on 2 cores.
#
#   examples/online_dpo/demo_comparison.sh DEMO_RUN [OUT=runs/online-dpo-demo/seed-SEED] [SEED=0] [--lr 1e-4 ...]
#
# Words after SEED go to the driver (python -m trainer_lib.demo.online_dpo_demo --help): --sft-refusals,
# --steps, --prompts-per-step, --lr, --loss, --beta, --rpo-alpha, --n, --temperature, --top-k, --judge, --sft,
# --max-new-tokens, --overlong-penalty, --min-reward-gap. Exits 1 when the goal
# (harmless +0.20 over SFT, over-refusal at most +0.05) is not met. One torch thread unless OMP_NUM_THREADS
# says otherwise (on 2 busy cores two threads made online DPO about 10 times slower).
set -euo pipefail
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
RUN=${1:?usage: demo_comparison.sh DEMO_RUN [OUT] [SEED] [driver options]}
SEED=${3:-0}
OUT=${2:-runs/online-dpo-demo/seed-$SEED}
shift $(($# < 3 ? $# : 3))
[ -f "$RUN/bootstrap/demo/preferences.jsonl" ] || { echo "error: $RUN is not a finished make demo run" >&2; exit 2; }
exec "$BIN/python" -m trainer_lib.demo.online_dpo_demo "$RUN" --out "$OUT" --seed "$SEED" "$@"
