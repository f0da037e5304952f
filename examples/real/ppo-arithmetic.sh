#!/usr/bin/env bash
# PPO for comparison with grpo-arithmetic: SmolLM2-135M-Instruct on the same arithmetic word problems.
#
#   make demo-real RECIPE=ppo-arithmetic SEED=0      (or: SEED=0 examples/real/ppo-arithmetic.sh)
#
# The same problems (the generator's seed 0), reward, sampling and evaluation as grpo-arithmetic.sh; PPO
# (ppo-arithmetic.yaml) samples one completion for each of 64 prompts a step and learns a critic
# (the policy with a new value head) for GAE. The gate states the same goal: math_accuracy >= base + 0.10.
# A rerun skips finished steps and resumes PPO from its last checkpoint (examples/real/lib.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

step data "$BIN/python" -m trainer_lib.demo.arithmetic "$ROOT/data" --train 4000 --held-out 300 --seed 0
step ppo "$BIN/posttrain" ppo --config examples/real/ppo-arithmetic.yaml "model.path=$MODEL" \
	"data.path=$ROOT/data/train.jsonl" "seed=$SEED" "output_dir=$ROOT/ppo" "${TRAIN_ARGS[@]}"
step evaluate "$BIN/posttrain" evaluate "models=base=$MODEL,ppo=$ROOT/ppo" baseline=base \
	"math.path=$ROOT/data/held_out.jsonl" math.max_new_tokens=64 humaneval.enabled=false \
	"gate.rules=math_accuracy>=baseline+0.10" "seed=$SEED" "output_dir=$ROOT/evaluate" "${EVAL_ARGS[@]}"
report "PPO on arithmetic word problems, SmolLM2-135M-Instruct" "$ROOT/evaluate"
