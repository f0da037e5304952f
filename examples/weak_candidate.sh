#!/usr/bin/env bash
# The evaluation gate turning down a weakened candidate (`make demo-weak`, after `make demo`).
#
# Trains SFT for 10 steps from the demo's base model, then evaluates that model in the candidate's place
# against the demo's SFT model, with the demo's gate rules and held-out sets. The gate must fail, and
# summary.md (printed) and report.html name each failing rule with both models' numbers.
# Exit status: 0 when the gate failed as it should, 1 when it passed.
#
#   examples/weak_candidate.sh [RUN_RECORD_DIR=runs/latest] [OUT=runs/weak]
set -euo pipefail
BIN=${BIN:-.venv/bin}
LATEST=${1:-runs/latest}
OUT=${2:-runs/weak}
[ -f "$LATEST/metrics.json" ] || { echo "error: $LATEST/metrics.json not found; run make demo first" >&2; exit 2; }

# where the demo's models and data are, and how it was judged (its parameters, else the DAG's defaults)
eval "$("$BIN/python" - "$LATEST" <<'PY'
import json, os, shlex, sys
from components.parameters import DEFAULT_GATE
latest = sys.argv[1]
metrics = json.load(open(os.path.join(latest, "metrics.json")))
params = json.load(open(os.path.join(latest, "run.json"))).get("parameters", {})
rules = params.get("gate_rules") or DEFAULT_GATE
rules = json.loads(rules) if isinstance(rules, str) else rules
values = {"BASE": metrics["paths"]["base"], "SFT": metrics["paths"]["sft"],
          "DEMO": os.path.dirname(metrics["data"]["tasks"]["path"]),
          "SEED": str(params.get("seed", 0)), "HUMANEVAL": str(params.get("humaneval_limit", 0)), "LENGTH": str(params.get("max_length", 256)),
          "RULES": "[" + ",".join(rules) + "]", "OVERRIDES": " ".join(json.loads(params["evaluate_overrides"])
                     if isinstance(params.get("evaluate_overrides"), str) else params.get("evaluate_overrides", []))}
print("\n".join(f"{k}={shlex.quote(v)}" for k, v in values.items()))
PY
)"

rm -rf "$OUT" && mkdir -p "$OUT/data"
cp "$DEMO/sft.jsonl" "$OUT/data/sft.jsonl"
"$BIN/posttrain" prepare data.path="$OUT/data" model.path="$BASE" output_dir="$OUT/prepared" \
    data.max_length="$LENGTH" seed="$SEED" > "$OUT/prepare.log" 2>&1
"$BIN/posttrain" sft model.path="$BASE" data.path="$OUT/prepared" output_dir="$OUT/sft10" max_steps=10 lr=1e-3 \
    data.max_length="$LENGTH" seed="$SEED" > "$OUT/sft10.log" 2>&1
# shellcheck disable=SC2086  # OVERRIDES: key=value words
"$BIN/posttrain" evaluate "models=[sft=$SFT,sft10=$OUT/sft10]" candidate=sft10 baseline=sft data_dir="$DEMO" \
    "gate.rules=$RULES" seed="$SEED" humaneval.limit="$HUMANEVAL" $OVERRIDES output_dir="$OUT/eval" > "$OUT/evaluate.log" 2>&1
cat "$OUT/eval/summary.md"
if grep -q "^# Evaluation: gate FAILED" "$OUT/eval/summary.md"; then
    echo; echo "the gate turned the 10-step candidate down (report: $OUT/eval/report.html)"
else
    echo; echo "error: the gate passed a 10-step SFT candidate" >&2; exit 1
fi
