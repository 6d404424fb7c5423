# Two entry points for a fresh machine (see README.md):
#   make demo   install into .venv, then run the main job: an Optuna study of gpt-tiny (SQLite)
#   make test   install into .venv, then ruff, mypy and the test suite (what CI runs)
VENV ?= .venv
BIN := $(VENV)/bin
PYTHON ?= python3

.PHONY: install demo test test-avx2 readme docs architecture examples wheel-check lint typecheck bench gpu-check policy profiles

$(BIN)/.installed: requirements/dev.txt requirements/constraints.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements/dev.txt
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/autotune study studies/gpt-tiny.toml

# The shipped policy (policies/pretrained), retrained as its policy.json records it: 120000 PPO
# steps, seed 0, 8 simulated environments, domain randomization over the 12 shipped profiles (the
# ranks drawn and the 8-step episodes are the code's, RANK_CHOICES and EPISODE_STEPS). Minutes on a quiet
# machine, and the policy the tests and `tune` load: run it after the profiles are regenerated.
# POLICY_OUT=/tmp/p POLICY_TIMESTEPS=2000 checks the command end to end in seconds.
POLICY_OUT ?= policies/pretrained
POLICY_TIMESTEPS ?= 120000
policy: install
	$(BIN)/autotune train-policy --timesteps $(POLICY_TIMESTEPS) --seed 0 --envs 8 --profiles $(sort $(wildcard envs/profiles/*.json)) --out $(POLICY_OUT) --overwrite

# mypy cannot follow setuptools' package-dir mapping (envs/ -> autotune.envs, policies/ ->
# autotune.policies), so it checks a staged copy laid out the way the package installs, and the
# GPU check script beside it (it calls the library as the CLI does, and runs only on a GPU machine).
typecheck: install
	rm -rf build/typecheck && mkdir -p build/typecheck
	cp -r autotune build/typecheck/autotune
	cp -r envs build/typecheck/autotune/envs
	cp -r policies build/typecheck/autotune/policies
	cp benchmarks/gpu_check.py build/typecheck/gpu_check.py
	cp benchmarks/picks.py build/typecheck/picks.py
	cp benchmarks/results.py build/typecheck/results.py
	cp benchmarks/decision_rule.py build/typecheck/decision_rule.py
	cp benchmarks/selective_study.py build/typecheck/selective_study.py
	cp benchmarks/repeatability.py build/typecheck/repeatability.py
	cp benchmarks/hf_decoders.py build/typecheck/hf_decoders.py
	cp benchmarks/peft_adapters.py build/typecheck/peft_adapters.py
	cp benchmarks/hf_families.py build/typecheck/hf_families.py
	cp benchmarks/reduced_factors.py build/typecheck/reduced_factors.py
	cp benchmarks/compile_ranking.py build/typecheck/compile_ranking.py
	cp scripts/architecture_diagram.py build/typecheck/architecture_diagram.py
	cp scripts/regenerate_profiles.py build/typecheck/regenerate_profiles.py
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p autotune
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml gpu_check.py picks.py results.py decision_rule.py selective_study.py repeatability.py hf_decoders.py peft_adapters.py hf_families.py reduced_factors.py compile_ranking.py architecture_diagram.py regenerate_profiles.py

lint: install typecheck
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two workers (pytest-xdist, one torch thread each: tests/conftest.py) on the 2-core CI machine,
# then the few tests that race a subprocess against a deadline, alone (marked serial).
WORKERS ?= 2
test: lint docs
	$(BIN)/pytest -n $(WORKERS) --durations=20 -m "not slow and not readme and not examples and not serial"
	$(BIN)/pytest -m serial

# The docs site (mkdocs.yml) into site/, warnings as errors: a broken link, an unresolvable API
# reference or a docstring mkdocstrings cannot read fails it. Seconds, not minutes.
docs: install
	$(BIN)/python docs/hooks/package_layout.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

# ARCHITECTURE.md's diagram of the homes and their imports, redrawn from the code (the import
# test fails when the file's copy is stale).
architecture: install
	$(BIN)/python scripts/architecture_diagram.py

# The CPU varies between machines: an AVX2 CPU has no bf16 units (bf16 matmul ~40x slower than
# fp32), an AVX512-bf16/AMX one makes bf16 faster. The tests whose paths depend on it (the
# machine probes, the environments, adaptive training, and the corpus matrix on one model per
# kind of kernel: oneDNN's LSTM, which has no bf16 on AVX2, ATen's GRU, convolutions with
# BatchNorm, attention) run again on AVX2 kernels, emulated on any x86 CPU by capping ATen's
# dispatch and oneDNN's ISA. On an AVX2 machine that is what `make test` just ran: skipped.
AVX2_CORPUS = lstm-lm gru-lm unet-tiny hf-gpt2
# The files whose tests time or run real steps (the simulator's, the codec's and the arithmetic's
# tests run no kernel: make test covered them).
AVX2_TESTS = $(addprefix tests/measurement/,test_probe.py test_schedule.py test_sidebyside.py test_tracker.py test_compiled.py test_busy.py) \
	tests/envs/test_training_env.py tests/envs/test_calibration.py tests/adapt/test_adaptive.py
test-avx2: install
	@if [ "$$($(BIN)/python -c 'import torch; print(torch.backends.cpu.get_cpu_capability())')" = AVX2 ]; then \
		echo "test-avx2: skipped: this CPU runs AVX2 kernels, and make test ran these tests on them"; \
	else \
		ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(BIN)/pytest -q -n $(WORKERS) $(AVX2_TESTS) \
			$(foreach m,$(AVX2_CORPUS),"tests/zoo/test_conformance.py::test_study_exports_and_tune[$(m)]"); \
	fi

# Every command README.md shows, run as written in a copy of the repository (minutes).
readme: install
	$(BIN)/pytest -m readme -s tests/test_readme.py

# Every script in examples/, run as a user runs it, from a fresh directory (tests/test_examples.py).
examples: install
	$(BIN)/pytest -m examples tests/test_examples.py

# The wheel and sdist as a user gets them: built, the wheel installed into a fresh venv outside
# the repository and run from outside it (--version, workloads, a 2-trial study, Adaptive with the
# pretrained policy), with only the base dependencies installed (a real `pip install` of the wheel,
# torch pinned): a command needing a missing extra is one line and exit 2. See .ci/wheel-check.sh.
wheel-check: install
	VENV=$(VENV) bash .ci/wheel-check.sh

bench: install
	$(BIN)/python benchmarks/overhead.py

# One prepared check on a CUDA GPU (under 8 minutes on one H100/H200, nothing downloaded): the
# device, measure vs the memory model, a study, tune and train --adapt, DeepSpeed ZeRO 0-3 on one
# rank, the Hugging Face callback. Writes report.json and report.md; without CUDA it says so, exit 0.
gpu-check: install
	$(BIN)/python benchmarks/gpu_check.py --out build/gpu-check

# The simulator profiles autotune ships (envs/profiles/*.json), regenerated as they were made
# (scripts/regenerate_profiles.py: same workloads, presets, batches, one thread). It times real
# steps: run it on a quiet machine (about 20-40 minutes on 2 cores), then retrain the policy.
profiles: install
	$(BIN)/python scripts/regenerate_profiles.py
