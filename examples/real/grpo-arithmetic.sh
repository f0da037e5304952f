#!/usr/bin/env bash
# RL with a verifiable reward on a real model: GRPO of SmolLM2-135M-Instruct on arithmetic word problems.
#
#   make demo-real RECIPE=grpo-arithmetic SEED=0      (or: SEED=0 examples/real/grpo-arithmetic.sh)
#
# 1. 4,000 training and 300 held-out problems of five families (trainer_lib/demo/arithmetic.py), each
#    question followed by the same answer instruction.
# 2. GRPO with accuracy_reward (grpo-arithmetic.yaml).
# 3. `posttrain evaluate` of the starting model (base) and GRPO's on the 300 held-out problems, greedy,
#    scored by the same lenient checker (the last number); math_format_rate counts the answers that
#    follow the instruction. The gate states the goal: math_accuracy >= base + 0.10.
# 4. Transfer: both on the first 100 GSM8K training rows (never trained on), with the same instruction.
# A rerun skips finished steps and resumes GRPO from its last checkpoint (examples/real/lib.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
DATA=${DATA:-../shared/data}
INSTRUCTION=$("$BIN/python" -c "from trainer_lib.demo.arithmetic import INSTRUCTION; print(INSTRUCTION)")

step data "$BIN/python" -m trainer_lib.demo.arithmetic "$ROOT/data" --train 4000 --held-out 300 --seed 0
step grpo "$BIN/posttrain" grpo --config examples/real/grpo-arithmetic.yaml "model.path=$MODEL" \
	"data.path=$ROOT/data/train.jsonl" "seed=$SEED" "output_dir=$ROOT/grpo" "${TRAIN_ARGS[@]}"
step evaluate "$BIN/posttrain" evaluate "models=base=$MODEL,grpo=$ROOT/grpo" baseline=base \
	"math.path=$ROOT/data/held_out.jsonl" math.max_new_tokens=64 humaneval.enabled=false \
	"gate.rules=math_accuracy>=baseline+0.10" "seed=$SEED" "output_dir=$ROOT/evaluate" "${EVAL_ARGS[@]}"
step transfer "$BIN/posttrain" evaluate "models=base=$MODEL,grpo=$ROOT/grpo" baseline=base \
	"math.path=$DATA/gsm8k_train.jsonl" math.limit=100 "math.template={question}
$INSTRUCTION" math.max_new_tokens=256 humaneval.enabled=false "seed=$SEED" "output_dir=$ROOT/transfer" \
	"${EVAL_ARGS[@]}"
report "GRPO on arithmetic word problems, SmolLM2-135M-Instruct" "$ROOT/evaluate" "$ROOT/transfer"
