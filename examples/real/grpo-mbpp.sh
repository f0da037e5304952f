#!/usr/bin/env bash
# Code, as the seed articles claim it: SFT then GRPO with the code-execution reward, SmolLM2-135M-Instruct
# on MBPP, judged by pass@1 on MBPP's held-out validation tasks.
#
#   make demo-real RECIPE=grpo-mbpp SEED=0      (or: SEED=0 examples/real/grpo-mbpp.sh)
#
# 1. MBPP's 474 rows (`posttrain prepare`): the 384 prompt and training tasks to train on, the 90
#    validation tasks 511-600 held out.
# 2. SFT on the training tasks' reference programs (sft-mbpp.yaml).
# 3. GRPO from the SFT model, each program run against its task's asserts in the sandbox (grpo-mbpp.yaml).
# 4. `posttrain evaluate` of the starting model (base), SFT's and GRPO's on the 90 held-out tasks, greedy
#    (pass@1). The gate states the goal: GRPO's task_pass_rate above the starting model's.
# A rerun skips finished steps and resumes a stage from its last checkpoint (examples/real/lib.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
DATA=${DATA:-../shared/data}

step mbpp "$BIN/posttrain" prepare "data.path=$DATA/mbpp_train_validation_prompt.jsonl" \
	data.eval_by=task_id:511-600 "output_dir=$ROOT/mbpp"
step sft "$BIN/posttrain" sft --config examples/real/sft-mbpp.yaml "model.path=$MODEL" "data.path=$ROOT/mbpp" \
	"seed=$SEED" "output_dir=$ROOT/sft" "${TRAIN_ARGS[@]}"
step grpo "$BIN/posttrain" grpo --config examples/real/grpo-mbpp.yaml "model.path=$ROOT/sft" \
	"data.path=$ROOT/mbpp" "seed=$SEED" "output_dir=$ROOT/grpo" "${TRAIN_ARGS[@]}"
step evaluate "$BIN/posttrain" evaluate "models=base=$MODEL,sft=$ROOT/sft,grpo=$ROOT/grpo" baseline=base \
	"tasks.path=$ROOT/mbpp/eval" tasks.max_new_tokens=160 humaneval.enabled=false \
	'gate.rules=task_pass_rate>baseline' "seed=$SEED" "output_dir=$ROOT/evaluate" "${EVAL_ARGS[@]}"
report "SFT then GRPO on MBPP, SmolLM2-135M-Instruct" "$ROOT/evaluate"
