#!/usr/bin/env bash
# make demo with every step in a container (make demo-containers; docs/images.md):
#
#   ENGINE=podman CONTAINERS_CONF=images/podman.conf BIN=.venv/bin examples/demo_containers.sh DEMO_PARAMS...
#
# 1. With podman, its Docker-compatible API on a socket of ours (kfp.local's DockerRunner speaks Docker's).
# 2. Triton on CPU in its container (ghcr.io/posttrain/posttrain-triton:<tag>-cpu), on an empty model
#    repository under the run root, on the host's network.
# 3. The demo DAG, each task in the CPU image (--runner docker --cpu-only); its deploy task publishes into
#    that repository and loads the model on that server over HTTP (model_repository=, triton_url=).
# 4. One question to the served model, beside PyTorch's answer from the exported model; then the server stops.
set -euo pipefail
ENGINE=${ENGINE:-docker}
BIN=${BIN:-.venv/bin}
ROOT=${ROOT:-runs/demo-containers}
TRITON_IMAGE=${TRITON_IMAGE:-ghcr.io/posttrain/posttrain-triton:0.1.0-cpu}
PORT=${TRITON_PORT:-18000}
PROMPT=${DEMO_PROMPT:-Define a Python function \`floor_at_two(x)\` that returns the larger of x and 2.}
SOCKET=${PODMAN_SOCKET:-/tmp/posttrain-podman.sock}
NAME=posttrain-triton-demo-$$

cleanup() {
	$ENGINE rm -f "$NAME" >/dev/null 2>&1 || true
	[ -z "${SERVICE:-}" ] || kill "$SERVICE" 2>/dev/null || true
}
trap cleanup EXIT
if [ "$ENGINE" = podman ]; then
	$ENGINE system service --time=0 "unix://$SOCKET" &
	SERVICE=$!
	export DOCKER_HOST="unix://$SOCKET"
	for _ in $(seq 30); do [ -S "$SOCKET" ] && break; sleep 1; done
fi

mkdir -p "$ROOT/repository"
REPO=$(readlink -f "$ROOT/repository")
[ "$(id -u)" != 0 ] || chown 1000:1000 "$REPO"  # the tasks' user publishes into it
$ENGINE run -d --name "$NAME" --network host -v "$REPO:$REPO:ro" "$TRITON_IMAGE" --model-repository="$REPO" \
	--http-address=127.0.0.1 --http-port="$PORT" --grpc-address=127.0.0.1 --grpc-port=$((PORT + 1)) \
	--metrics-address=127.0.0.1 --metrics-port=$((PORT + 2)) >/dev/null

"$BIN/posttrain" pipeline run --pipeline posttrain-all --runner docker --cpu-only --root "$ROOT/runs" \
	--latest "$ROOT/latest" "model_repository=$REPO" "triton_url=http://127.0.0.1:$PORT" "$@"
if [ ! -d "$ROOT/latest/exported_model" ]; then
	echo "the evaluation gate failed, so nothing was exported or served (see $ROOT/latest/report.html)"
	exit 1
fi
"$BIN/posttrain" serve --url "http://127.0.0.1:$PORT" --ask "$PROMPT" --chat --compare "$ROOT/latest/exported_model"
