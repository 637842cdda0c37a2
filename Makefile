# Every target bootstraps .venv idempotently; the stamp file is refreshed when pyproject.toml changes.
# VENV=/path/to/venv puts it elsewhere (e.g. a throwaway one: make setup VENV=/tmp/venv-try).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo yes)
TORCH := 2.13.0
# PyTorch's own index of CPU-only wheels: the default index's Linux torch is the CUDA build (GBs of CUDA libraries).
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
# The sglang release whose own definitions tests/unit/inference/test_sglang_wire_schema.py checks the SGLang client
# and `agentrl engine serve` against. Only its wheel is downloaded (never installed or imported: the test reads its
# sources from the zip); --platform/--python-version pick the same file on every host, since the Python sources of
# all its builds are the same.
SGLANG_WIRE := 0.5.23
SGLANG_WIRE_STAMP := $(VENV)/share/sglang-wire/.sglang-$(SGLANG_WIRE)

.PHONY: setup quickstart test test-unit test-slow lint bwrap gxx chromium clean

setup: $(STAMP) $(SGLANG_WIRE_STAMP) bwrap gxx chromium

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# No GPU: the CPU build of torch from PyTorch's CPU index (the torch wheel alone; its dependencies come from pip's
# own sources on the next line). Where that index cannot be reached, pip's configured sources give torch (a local
# wheel folder may hold the CPU build); the line printed says which build was installed. A GPU: the default build.
$(STAMP): pyproject.toml | $(BIN)/python
ifneq ($(HAS_GPU),yes)
	@from="$(TORCH_CPU_INDEX)"; \
	if ! $(BIN)/python -c "import urllib.request as r; r.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=15)" \
	    >/dev/null 2>&1 || ! $(BIN)/pip install --quiet --no-deps --index-url $(TORCH_CPU_INDEX) torch==$(TORCH); \
	then from="pip's configured sources ($(TORCH_CPU_INDEX) cannot be reached)"; fi; \
	$(BIN)/pip install --quiet torch==$(TORCH) && $(BIN)/python -W ignore -c "import sys, torch; \
	build = 'CPU build' if torch.version.cuda is None else f'CUDA {torch.version.cuda} build, no GPU here'; \
	print(f'installed torch {torch.__version__} ({build}) from {sys.argv[1]}')" "$$from"
endif
	$(BIN)/pip install --quiet -e '.[dev,envs,agents]'
	touch $(STAMP)

$(SGLANG_WIRE_STAMP): | $(BIN)/python
	@if $(BIN)/pip download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
	    --platform manylinux_2_34_x86_64 --dest $(VENV)/share/sglang-wire sglang==$(SGLANG_WIRE); then touch $@; \
	else echo "warning: could not download the sglang==$(SGLANG_WIRE) wheel; the SGLang wire-format tests will skip"; fi

bwrap:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (sandbox isolation)"; \
	    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 || (apt-get update -qq >/dev/null && apt-get install -y -qq bubblewrap >/dev/null)); \
	  else echo "warning: bubblewrap missing and not root; the sandbox will refuse to start without --allow-unsafe"; fi; \
	fi

# g++/gcc: the sandbox compiles `language: cpp` / `c` with the host's compiler (inside the sandbox), and builds
# its zygote's small C helper (sandbox/backends/nsutil.c) with it; without one every sandbox starts bwrap.
gxx:
	@if ! command -v g++ >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing g++ (sandbox languages cpp and c)"; \
	    (apt-get install -y -qq g++ >/dev/null 2>&1 || (apt-get update -qq >/dev/null && apt-get install -y -qq g++ >/dev/null)); \
	  else echo "warning: g++ missing and not root; the sandbox will not offer cpp and c"; fi; \
	fi

# chromium: the browser test of `agentrl view` drives Debian's chromium with Playwright (no browser download).
chromium:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium (browser test of agentrl view)"; \
	    (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null)); \
	  else echo "warning: chromium missing and not root; the viewer's browser test will be skipped"; fi; \
	fi

# the quickstart needs the venv and the sandbox's isolation, not the compiler or the test browser;
# ARGS go to agentrl quickstart, e.g. make quickstart ARGS="--set seed=1"
quickstart: $(STAMP) bwrap
	$(BIN)/agentrl quickstart $(ARGS)

# ruff over the whole tree (pyproject.toml [tool.ruff]); the import layering is tests/unit/test_layering.py
lint: $(STAMP)
	$(BIN)/ruff check .

test: setup lint
	$(BIN)/python -m pytest -q -rs --durations=25 tests

test-unit: setup
	$(BIN)/python -m pytest -q tests/unit

test-slow: setup
	$(BIN)/python -m pytest -q -m slow tests

clean:
	rm -rf $(VENV) runs .pytest_cache
