# Every target sets up what it needs: a venv in .venv with zerolite installed (editable).
# On machines without an NVIDIA GPU the CPU build of torch is pinned (constraints-cpu.txt).
VENV      ?= .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.zerolite-installed
NPROC     ?= 2
CONSTRAINTS := $(if $(shell command -v nvidia-smi 2>/dev/null),,-c constraints-cpu.txt)

.PHONY: setup demo test test-torch211 test-slow ds-golden ds-clients docs bench bench-peers plots gpu-check gpu-check-dry clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints-cpu.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(CONSTRAINTS) -e ".[test,triton]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/torchrun --standalone --nproc_per_node $(NPROC) examples/train_gpt.py \
		--deepspeed_config configs/demo_zero3_cpu.json

test: $(STAMP)
	$(PY) -m pytest -q --durations=15

# The suite under the GPU machine's torch (2.11) and triton (3.6): a second venv. PyPI's
# torch 2.11 wheel is its CUDA build (~3 GB with its CUDA libraries); it runs on the CPU.
VENV211   ?= .venv-torch211
test-torch211:
	test -x $(VENV211)/bin/python || python3 -m venv $(VENV211)
	$(VENV211)/bin/python -m pip install --quiet --disable-pip-version-check \
		torch==2.11.0 triton==3.6.0 -e ".[test]"
	$(VENV211)/bin/python -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# Real DeepSpeed 0.19.8 beside zerolite, in its own folder next to torch (`pip install
# --target`): the pure-Python wheel in ../shared/gpu-wheels where there is one, else PyPI's
# source release (DS_BUILD_OPS=0: no op is compiled), and the dependencies the venv lacks.
DS_SITE ?= .ds-site
DS_WHEEL ?= $(or $(wildcard ../shared/gpu-wheels/deepspeed-0.19.8-py3-none-any.whl),deepspeed==0.19.8)
$(DS_SITE)/.installed: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check --target $(DS_SITE) \
		einops hjson msgpack ninja py-cpuinfo "pydantic>=2" tqdm
	DS_BUILD_OPS=0 $(PY) -m pip install --quiet --disable-pip-version-check --target $(DS_SITE) \
		--no-deps --no-build-isolation $(DS_WHEEL)
	touch $@

# Re-record what real DeepSpeed observes in the conformance client
# (tests/ds_golden/ds_conformance.json, which tests/test_ds_conformance.py holds zerolite to).
ds-golden: $(DS_SITE)/.installed
	$(PY) tools/ds_golden.py --python $(PY) --pythonpath $(DS_SITE)

# The unchanged clients (HF Trainer, Accelerate loops, TRL SFT/DPO/GRPO, DeepSpeed-Chat) under
# real DeepSpeed and under zerolite, now, compared (tests/test_ds_clients.py; .ci/run runs it),
# and the peers benchmark's DeepSpeed engine: every test marked `deepspeed`.
ds-clients: $(DS_SITE)/.installed
	ZEROLITE_DS_SITE=$(DS_SITE) $(PY) -m pytest -q -m deepspeed

# The documentation site into site/ (mkdocs-material + mkdocstrings, the `docs` extra), with
# every warning an error; the config reference is generated from zerolite/config/ as it builds.
DOCS_STAMP := $(VENV)/.zerolite-docs
$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check $(CONSTRAINTS) -e ".[test,triton,docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --clean --site-dir site

bench: $(STAMP)
	$(PY) -m pytest benchmarks -q -m "" --benchmark-only --benchmark-json=benchmarks/results/latest.json

# zerolite ZeRO-3 vs FSDP2, DDP and DeepSpeed (if `import deepspeed` works in PEERS_PY) on
# CPU/gloo: the small set of the config matrix (benchmarks/peers/configs.py). DeepSpeed lives
# in its own venv: make bench-peers PEERS_PY=/path/to/venv-with-deepspeed/bin/python
PEERS_PY ?= $(PY)
bench-peers: $(STAMP)
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PEERS_PY) -m benchmarks.peers.run \
		--sizes 20M --worlds 2 --dtypes fp32 --configs ds_defaults,issue16 --gas 1,2 \
		--engines zerolite3,fsdp2,ddp,deepspeed --steps 4 --warmup 1 --name peers_small

# Redraw every picture in benchmarks/results/ from the JSON beside it (matplotlib, the `bench`
# extra; benchmarks/plots/).
BENCH_STAMP := $(VENV)/.zerolite-bench
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check $(CONSTRAINTS) -e ".[test,triton,bench]"
	touch $(BENCH_STAMP)

plots: $(BENCH_STAMP)
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PY) -m benchmarks.plots

# On one CUDA GPU, within 9 minutes: kernel GB/s, the 1.3B peers table (PyTorch, FSDP2,
# DeepSpeed, zerolite), the cuda tests, prefetch on/off with a profiler trace and timeline,
# CPU offload, all under benchmarks/results/gpu_check/ (summary.json). Without CUDA it says so
# and exits 0; `make gpu-check-dry` runs every phase on the CPU with a tiny model.
gpu-check: $(STAMP)
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PY) benchmarks/gpu_check.py \
		--out benchmarks/results/gpu_check

gpu-check-dry: $(STAMP)
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PY) benchmarks/gpu_check.py --dry-run \
		--out benchmarks/results/gpu_check_dry

clean:
	rm -rf $(VENV) build site dist *.egg-info
