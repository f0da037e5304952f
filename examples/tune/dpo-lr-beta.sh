#!/bin/sh
# Issue 47's acceptance search, reproducible (docs/tuning.md records a run): the demo data, a tiny
# model and a short SFT, the search of dpo-lr-beta.yaml, then DPO with the stage's default lr and beta
# (1e-4, 0.1) at the same steps and seed, for comparison. PYTHON picks the interpreter (default python).
set -eu
cd "$(dirname "$0")/../.."
R=runs/tune-dpo-example
posttrain() { "${PYTHON:-python}" -m trainer_lib.cli "$@"; }
export POSTTRAIN_NO_PROGRESS=1

posttrain demo-data output_dir=$R/demo-data n_code_train=300 n_code_eval=20 n_safety_train=100 \
    n_safety_eval=20 n_safety_sft=30
posttrain tiny-model corpus=$R/demo-data/corpus.txt output_dir=$R/tiny vocab_size=512 hidden_size=64
posttrain sft model.path=$R/tiny data.path=$R/demo-data/sft.jsonl output_dir=$R/sft max_steps=100 lr=1e-3 \
    save_steps=0 eval_steps=0 report_to=none
posttrain tune --config examples/tune/dpo-lr-beta.yaml
# the best trial's whole config (steps, seed, data) with the stage's default lr and beta
posttrain dpo --config $R/search/best.yaml lr=1e-4 beta=0.1 output_dir=$R/default
"${PYTHON:-python}" - "$R" <<'PY'
import json, sys
run = sys.argv[1]
best = json.load(open(f"{run}/search/results.json"))["best"]
default = json.load(open(f"{run}/default/summary.json"))["eval"]["logps/accuracy"]
print(f"best trial {best['trial']}: logps/accuracy {best['value']:.4g}; default lr and beta: {default:.4g}")
PY
