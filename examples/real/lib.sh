# Shared by the recipes in examples/real/ (sourced): where things go, and each step run once, timed.
#
#   SEED=0          the run's seed (sampling, data order); one seed per command
#   MODEL=...       the starting model; default SmolLM2-135M-Instruct's GGUF from `make real-model`
#   ROOT=...        where the run goes; default runs/real-recipes/<recipe>/seed-<SEED>
#   TRAIN_ARGS=...  key=value overrides for the training stages, e.g. bigger settings on a GPU
#   EVAL_ARGS=...   key=value overrides for the evaluations (engine=vllm, batch_size=64, ...)
BIN=${BIN:-.venv/bin}
SEED=${SEED:-0}
MODEL=${MODEL:-.cache/real-model/SmolLM2-135M-Instruct.Q4_1.gguf}
RECIPE=$(basename "$0" .sh)
ROOT=${ROOT:-runs/real-recipes/$RECIPE/seed-$SEED}
read -r -a TRAIN_ARGS <<<"${TRAIN_ARGS:-}"
read -r -a EVAL_ARGS <<<"${EVAL_ARGS:-}"
[ -e "$MODEL" ] || { echo "error: MODEL=$MODEL not found (make real-model)" >&2; exit 2; }
mkdir -p "$ROOT/.done"

# step NAME COMMAND...: run COMMAND unless an earlier run of the recipe finished it ($ROOT/.done/NAME holds
# its seconds). A training stage stopped midway resumes from its last checkpoint when rerun.
step() {
	local name=$1 start=$SECONDS
	shift
	if [ -f "$ROOT/.done/$name" ]; then
		echo "== $name: done earlier, in $(cat "$ROOT/.done/$name") s"
		return
	fi
	echo "== $name: $*"
	"$@"
	echo $((SECONDS - start)) >"$ROOT/.done/$name"
}

# report TITLE EVAL_DIR...: each evaluation's table and gate (from its summary.md) and each step's time,
# printed and written to $ROOT/report.md; exits 1 when the first evaluation's gate (the recipe's goal) failed.
report() {
	local title=$1 dir name
	shift
	{
		echo "# $title (seed $SEED)"
		for dir in "$@"; do
			echo
			echo "## $(basename "$dir"): $dir/metrics.json"
			echo
			awk '/^\|/ { print; table = 1; next } table { print ""; table = 0 }' "$dir/summary.md"  # the tables
		done
		echo
		echo "| step | seconds |"
		echo "|---|---:|"
		for name in $(ls -tr "$ROOT/.done"); do  # in the order they finished
			echo "| $name | $(cat "$ROOT/.done/$name") |"
		done
	} | tee "$ROOT/report.md"
	echo "report: $ROOT/report.md"
	grep -q '^# Evaluation: gate PASSED' "$1/summary.md"
}
