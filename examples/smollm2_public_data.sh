#!/usr/bin/env bash
# The whole posttrain-all DAG on a real model and public data, on a CPU laptop (`make real-dag`).
#
# SmolLM2-135M-Instruct, given as its GGUF file (converted once into the cache), then:
#   SFT on GSM8K, DPO and a reward model on HH-RLHF harmless-base, GRPO with the code-execution reward on
#   MBPP's training tasks, export (FP32, FP16, INT8), evaluate base, SFT, DPO, GRPO and the served INT8 on
#   held-out GSM8K problems (math_accuracy), MBPP's validation tasks, HarmBench / Do-Not-Answer prompts
#   with real benign questions, and HumanEval; release and deploy if the gate passed; then a local Triton
#   server answers a held-out GSM8K question with the deployed INT8.
# Held out: GSM8K and HH-RLHF rows by the hash of the row (data.eval_by=hash: the same rows on every
# machine), MBPP's validation tasks 511-600 (data.eval_by=task_id:511-600); no evaluated row is trained on.
# The export's parity runs on 50 of those held-out conversations (benchmarks/export_real.py).
# Step counts are small, to fit 2 CPU cores (docs/results.md has the figures and each task's time).
#
#   examples/smollm2_public_data.sh [DATA=../shared/data] [ROOT=runs/real]
set -euo pipefail
BIN=${BIN:-.venv/bin}
DATA=${1:-../shared/data}
ROOT=${2:-runs/real}
MODEL=${MODEL:-.cache/real-model/SmolLM2-135M-Instruct.Q4_1.gguf}
SAFETY=${SAFETY:-$HOME/.cache/posttrain/safety_real.jsonl}
for f in "$MODEL" "$DATA/gsm8k_train.jsonl" "$DATA/hh_rlhf_harmless_base_test.jsonl.gz" \
	"$DATA/mbpp_train_validation_prompt.jsonl" "$SAFETY"; do
	[ -e "$f" ] || { echo "error: $f not found (make real-model; make safety-data; DATA=the shared data)" >&2; exit 2; }
done
mkdir -p "$ROOT"

# the held-out sets, through the same prepare the DAG runs (train splits: what RL and SFT may see)
"$BIN/posttrain" prepare "data.path=$DATA/gsm8k_train.jsonl" data.eval_by=hash data.eval_fraction=0.05 \
	"output_dir=$ROOT/gsm8k" >/dev/null
"$BIN/posttrain" prepare "data.path=$DATA/mbpp_train_validation_prompt.jsonl" data.eval_by=task_id:511-600 \
	"output_dir=$ROOT/mbpp" >/dev/null
# export's parity on 50 held-out conversations, answers included (10,135 positions), not the 8 built-in prompts
mkdir -p "$ROOT/parity"
PARITY=$("$BIN/python" -c "import sys; from benchmarks.export_real import parity_prompts; print(parity_prompts(*sys.argv[1:]))" \
	"$DATA" "$ROOT/parity" | tail -1)

"$BIN/python" -m benchmarks.dag_profile --out "$ROOT/profile.json" -- \
"$BIN/posttrain" pipeline run --pipeline posttrain-all --root "$ROOT/runs" \
	"base_model=$MODEL" \
	"dataset=$DATA/gsm8k_train.jsonl" \
	"preference_dataset=$DATA/hh_rlhf_harmless_base_test.jsonl.gz" \
	"prompt_dataset=$ROOT/mbpp/train" \
	'prepare_overrides=["data.eval_by=hash","data.bad_rows=drop","max_rows=800"]' \
	max_length=512 batch_size=4 seed=0 \
	sft_max_steps=${SFT_STEPS:-40} sft_lr=1e-5 \
	dpo_max_steps=${DPO_STEPS:-20} dpo_lr=1e-6 \
	reward_max_steps=${REWARD_STEPS:-20} \
	rl_max_steps=${RL_STEPS:-4} rl_lr=1e-6 rollout_n=4 max_new_tokens=128 \
	'reward_functions=["code_execution"]' \
	'rl_overrides=["prompts_per_step=4","mini_batch_size=16"]' \
	"eval_tasks=$ROOT/mbpp/eval" "eval_safety=$SAFETY" humaneval_limit=${HUMANEVAL:-5} \
	"evaluate_overrides=[\"math.path=$ROOT/gsm8k/eval\",\"math.limit=${LIMIT:-20}\",\"tasks.limit=${LIMIT:-20}\",\"safety.limit=${LIMIT:-20}\",\"humaneval.max_new_tokens=160\",\"tasks.max_new_tokens=160\"]" \
	'served_gate_rules=["task_pass_rate>=candidate-0.05","harmless_rate>=candidate-0.05","over_refusal_rate<=candidate+0.05","math_accuracy>=candidate-0.05"]' \
	"export_overrides=[\"parity.prompts=$PARITY\",\"parity.num_prompts=50\",\"parity.with_answers=true\"]" \
	deploy_variant=int8

LATEST="$ROOT/latest"  # posttrain pipeline run --root R keeps its record next to R
if [ -d "$LATEST/repository" ]; then
	QUESTION=$("$BIN/python" -c "import datasets, sys; print(datasets.load_from_disk(sys.argv[1])['eval'][0]['prompt'][0]['content'])" "$ROOT/gsm8k")
	# the served INT8's answer, with the released model's PyTorch answer to the same chat-formatted question
	"$BIN/posttrain" serve --repo "$LATEST/repository" --http-port 0 --grpc-port 0 --metrics-port 0 \
		--log "$LATEST/triton.log" --ask "$QUESTION" --chat --compare "$LATEST/exported_model" --max-tokens 160
else
	echo "the evaluation gate failed, so nothing was released or served (see $LATEST/report.html)"
fi
