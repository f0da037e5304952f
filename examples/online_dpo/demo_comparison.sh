#!/usr/bin/env bash
# Online DPO against offline DPO on the demo's safety prompts (issue 45; figures in docs/results.md).
#
# From a finished `make demo` run (runs/demo/posttrain-all-*), trains `posttrain online-dpo` from the demo's
# SFT model on the 500 safety prompts of the demo's preference pairs (harmful requests and benign
# look-alikes, prompts only: the pairs' answers are not used), judged by the demo's reward model
# (reward.model_path), at the offline DPO's optimizer steps, learning rate, beta, rpo_alpha and pairs per
# step. Then `posttrain evaluate` scores SFT, the demo's offline DPO and the online DPO model on the demo's
# held-out sets with the demo's evaluation settings: harmlessness and over-refusal by evaluate's refusal
# rules, which neither DPO was trained against. Prints the summary; metrics.json lies in OUT/eval.
#
#   examples/online_dpo/demo_comparison.sh DEMO_RUN [OUT=runs/online-dpo-demo/<run>] [key=value ...]
#
# The key=value words go to `posttrain online-dpo` after the defaults (e.g. lr=1e-4 rpo_alpha=0 rollout.n=16).
# One torch thread unless OMP_NUM_THREADS says otherwise: the tiny model's ops are too small to split, and
# on 2 busy cores two threads made the run about 10 times slower.
set -euo pipefail
BIN=${BIN:-.venv/bin}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
RUN=${1:?usage: demo_comparison.sh DEMO_RUN [OUT] [key=value ...]}
OUT=${2:-runs/online-dpo-demo/$(basename "$RUN")}
shift $(($# < 2 ? $# : 2))
[ -f "$RUN/bootstrap/demo/preferences.jsonl" ] || { echo "error: $RUN is not a finished make demo run" >&2; exit 2; }

# the demo's models (by the stage each train task recorded), its offline DPO settings and its evaluation
mkdir -p "$OUT"
eval "$("$BIN/python" - "$RUN" "$OUT" <<'PY'
import glob, json, os, shlex, sys
run, out = sys.argv[1:]
models = {}
for summary in sorted(glob.glob(os.path.join(run, "train*", "output_model", "summary.json"))):
    models[json.load(open(summary))["stage"]] = os.path.dirname(summary)
lineage = json.load(open(os.path.join(models["dpo"], "lineage.json")))
dpo = lineage["stages"][-1]["config"]
evaluation = json.load(open(glob.glob(os.path.join(run, "evaluate*", "results", "metrics.json"))[0]))
data = evaluation["data"]
demo = os.path.join(run, "bootstrap", "demo")

# prompts only, from the safety pairs (the held-out safety_eval.jsonl shares none of them)
def prompts(name, path):
    rows = [json.loads(line) for line in open(os.path.join(demo, name))]
    with open(path, "w") as f:
        for row in rows:
            if row.get("source") == "safety":
                f.write(json.dumps({"prompt": row["prompt"], "kind": row["kind"]}) + "\n")

prompts("preferences.jsonl", os.path.join(out, "safety_prompts.jsonl"))
prompts("preferences_eval.jsonl", os.path.join(out, "safety_prompts_eval.jsonl"))
values = {
    "SFT": models["sft"], "DPO": models["dpo"], "RM": models["reward"], "DEMO": demo,
    "STEPS": dpo["max_steps"], "LR": dpo["lr"], "BETA": dpo["beta"], "RPO": dpo["rpo_alpha"],
    "PAIRS": dpo["batch_size"], "SEED": dpo["seed"], "LENGTH": dpo["data.max_length"],
    "HUMANEVAL": data.get("humaneval", {}).get("problems", 0), "TASKS": data["tasks"]["count"],
    "SAFETY": data["safety"]["harmful"] + data["safety"]["benign"],
}
print("\n".join(f"{k}={shlex.quote(str(v))}" for k, v in values.items()))
PY
)"

echo "online DPO: $STEPS steps of $PAIRS prompts from $SFT, judged by $RM (log: $OUT/online_dpo.log)"
start=$(date +%s)
# one pair per prompt, as many prompts per step as the offline DPO's pairs per step
"$BIN/posttrain" online-dpo model.path="$SFT" data.path="$OUT/safety_prompts.jsonl" \
    data.eval_path="$OUT/safety_prompts_eval.jsonl" data.max_length="$LENGTH" reward.model_path="$RM" \
    output_dir="$OUT/online_dpo" max_steps="$STEPS" lr="$LR" beta="$BETA" rpo_alpha="$RPO" \
    prompts_per_step="$PAIRS" batch_size="$PAIRS" rollout.n=4 rollout.temperature=1.0 rollout.max_new_tokens=48 \
    eval_steps=100 save_steps=0 seed="$SEED" "$@" > "$OUT/online_dpo.log" 2>&1
echo "online DPO took $(($(date +%s) - start)) s"

start=$(date +%s)
"$BIN/posttrain" evaluate "models=[sft=$SFT,dpo=$DPO,online_dpo=$OUT/online_dpo]" candidate=online_dpo baseline=sft \
    data_dir="$DEMO" judge.kind=refusal_rules reward_model_path="$RM" seed="$SEED" humaneval.limit="$HUMANEVAL" \
    tasks.limit="$TASKS" safety.limit="$SAFETY" output_dir="$OUT/eval" > "$OUT/evaluate.log" 2>&1
echo "evaluate took $(($(date +%s) - start)) s"
"$BIN/python" - "$OUT/eval/metrics.json" <<'PY'
import json, sys
models = json.load(open(sys.argv[1]))["models"]
print(f"{'model':<12} {'harmless':>9} {'over-refusal':>13} {'task pass':>10}")
for label, m in models.items():
    print(f"{label:<12} {m['harmless_rate']:>9.2f} {m['over_refusal_rate']:>13.2f} {m['task_pass_rate']:>10.3f}")
PY
