# recoverd — two commands on a fresh machine: `make demo` and `make test`.
# Everything goes into a project-local virtual environment (.venv); no root, no apt, no Docker.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_STAMP := $(VENV)/.torch-installed
PYTEST_ARGS ?=
## Tests run in parallel processes (pytest-xdist): much of their time is waiting on processes and
## etcd, so three workers keep two cores busy (about 80%); work stealing keeps a long test started
## late from holding up the end (make test 5m42s -> 4m41s of tests). PYTEST_WORKERS=0 runs them in one.
PYTEST_WORKERS ?= 3

.PHONY: gpu-check-bundle gpu-check-rehearsal test-slow all venv torch demo-torch bench bench-hangs bench-node-loss bench-scale bench-tls bench-ddp bench-fsdp proto demo test test-unit chaos lint format typecheck clean fresh-clone-test msrun-venv test-msrun

all: test

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## PyTorch (CPU, pinned: requirements-torch.txt) for taskd_client.pytorch, its tests, demo-torch and bench.
$(TORCH_STAMP): $(STAMP) requirements-torch.txt
	$(PY) -m pip install --quiet -r requirements-torch.txt
	touch $@

torch: $(TORCH_STAMP)

## Regenerate the Python code from proto/ (generated code is committed: docs/adr/0004).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I proto --python_out=libs --pyi_out=libs \
		proto/recoverd/v1/records.proto
	$(PY) -m grpc_tools.protoc -I proto --python_out=libs --pyi_out=libs --grpc_python_out=libs \
		proto/recoverd/mindcluster/recover.proto

## A 4-rank job whose rank 2 is SIGKILLed and recovered in place (embedded etcd; no torch).
demo: $(STAMP)
	$(PY) examples/demo.py

## DDP training (4 ranks, gloo, CPU) whose rank 1 is SIGKILLed: the others keep running (needs torch).
demo-torch: $(TORCH_STAMP)
	$(PY) examples/demo_torch.py

## Recovery times and recoverd against torchrun on the same DDP job, then on the same FSDP2 job
## (make bench-fsdp) (~25 min; bench/results/).
BENCH_ARGS ?=
bench: $(TORCH_STAMP)
	$(PY) -m pip install --quiet -r requirements-bench.txt
	$(PY) bench/bench.py $(BENCH_ARGS)
	$(PY) bench/fsdp.py $(FSDP_ARGS)

## Hang detection: SIGSTOP of a rank -> its hang fault, 0.1 s and 2.5 s steps, and two PyTorch jobs
## whose collectives block for good (~6 min; bench/results/hangs.*).
bench-hangs: $(TORCH_STAMP)
	$(PY) bench/hangs.py $(BENCH_ARGS)

## Node loss (docs/adr/0025): SIGKILL of a node's agent and ranks -> the coordinator's lost-node fault,
## 10 trials against an etcd with stock flags; bench/results/node_loss.json. The false-alarm soak
## (meant to run beside `make bench` or other load): NODE_LOSS_ARGS="--trials 0 --soak 600".
NODE_LOSS_ARGS ?= --trials 10
bench-node-loss: $(STAMP)
	$(PY) bench/node_loss.py $(NODE_LOSS_ARGS)

## What ResilientTrainer costs per step against plain DDP, with torch's DDP and with its flat
## all-reduce, side by side, with the example's 10 ms standing for compute and with none (~6 min;
## bench/results/ddp_overhead*.{json,md}; docs/pytorch.md).
DDP_ARGS ?=
bench-ddp: $(TORCH_STAMP)
	$(PY) bench/ddp_overhead.py --step-sleep 0.01 $(DDP_ARGS)
	$(PY) bench/ddp_overhead.py --step-sleep 0 --name ddp_overhead_no_compute $(DDP_ARGS)

## A sharded model (FSDP2, HSDP 2 x 2, 4 CPU ranks): SIGKILL -> next step, recoverd healing from the
## twin against torchrun resuming from its DCP checkpoint, side by side (~4 min; bench/results/fsdp.*).
FSDP_ARGS ?=
bench-fsdp: $(TORCH_STAMP)
	$(PY) bench/fsdp.py $(FSDP_ARGS)

## What TLS and authentication cost each etcd call: plaintext, TLS, TLS + per-job user, side by side
## (~1 min; bench/results/tls.{json,md}; docs/security.md).
bench-tls: $(STAMP)
	$(PY) bench/tls.py $(TLS_ARGS)

## Lint, type-check, then every test (unit and end-to-end against a throwaway etcd) but the slow ones.
test: $(STAMP) $(TORCH_STAMP) lint typecheck
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m "not slow" $(PYTEST_ARGS)

## The end-to-end tests of 15 s or more on 2 cores (node replacement, elastic 4 -> 2 -> 4, 30 s etcd
## member stalls) and the torch jobs beyond one representative each (~8 min); .ci/run runs them after
## make test.
test-slow: $(STAMP) $(TORCH_STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal -m slow $(PYTEST_ARGS)

## One recovery at 64..1,024 simulated nodes (the real agent code, in-memory ranks) against a real etcd:
## rank kill, node loss, exit; 20 jobs on one control plane; 64 real agents (~30 min; docs/scale.md).
## SCALE_ARGS="--sizes 64x8,512x8 --trials 5 --concurrent 0 --real 0" for a part.
SCALE_ARGS ?=
bench-scale: $(STAMP)
	$(PY) -m pip install --quiet -r requirements-bench.txt
	$(PY) bench/scale.py $(SCALE_ARGS)

## Every chaos scenario, repeated (~15 min): control-plane kills, etcd restarts, mass rank kills,
## bad input, agent restarts and partitions; writes tests/chaos/results/ (docs/reliability.md); then
## the 3-member etcd tests with 30 s member stalls (tests/integration/test_etcd_cluster.py, ~2 min).
## A subset runs in make test (tests/chaos/scenarios.py: MAKE_TEST_SUBSET). CHAOS_ARGS="--trials 3 -k etcd".
CHAOS_ARGS ?=
chaos: $(STAMP)
	$(PY) -m tests.chaos.run $(CHAOS_ARGS)
	$(PY) -m pytest -q -n 0 -s tests/integration/test_etcd_cluster.py

test-unit: $(STAMP)
	$(PY) -m pytest -q tests/unit $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check libs services tests examples scripts
	$(PY) scripts/gen_state_diagram.py --check

format: $(STAMP)
	$(VENV)/bin/ruff format libs services tests examples scripts
	$(VENV)/bin/ruff check --fix libs services tests examples scripts

typecheck: $(STAMP) $(TORCH_STAMP)
	MYPY=$(VENV)/bin/mypy bash scripts/typecheck.sh

## Opt-in: MindSpore 2.10.0's real msrun (~3 GB, its own venv) driving recoverd's MSRunPlugin.
MSRUN_VENV ?= .venv-msrun
$(MSRUN_VENV)/.installed:
	$(PYTHON) -m venv $(MSRUN_VENV)
	$(MSRUN_VENV)/bin/python -m pip install --quiet mindspore==2.10.0
	$(MSRUN_VENV)/bin/python -m pip install --quiet -e .
	touch $@

msrun-venv: $(MSRUN_VENV)/.installed

test-msrun: $(STAMP) msrun-venv
	RECOVERD_TEST_MSRUN=1 RECOVERD_TEST_MSRUN_VENV=$(MSRUN_VENV) $(PY) -m pytest -q tests/integration/test_real_msrun.py

## What scripts/gpu_check.sh needs on the device machine beyond its image (no network there):
## recoverd's dependencies as wheels for its Python 3.12 and the etcd binary, in .gpu-bundle/
## (git-ignored, ~15 MB): carry it (docs/gpu.md has the exact device command).
gpu-check-bundle: $(STAMP)
	bash scripts/gpu_check_bundle.sh

## scripts/gpu_check.sh's checks with the CPU for the GPU and NVML's stand-in (~2 min): proves the
## harness, not the GPU. Results in gpu_check_out/.
gpu-check-rehearsal: $(TORCH_STAMP)
	GPU_CHECK_PYTHON=$(PY) bash scripts/gpu_check.sh --rehearse-on-cpu

## Proves `make demo` and `make test` from a fresh clone with a clean environment.
fresh-clone-test:
	bash scripts/fresh_clone_test.sh

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache *.egg-info
