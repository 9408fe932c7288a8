# Set-up and the two quick-start jobs. TORCH picks the torch build: the default is the CPU wheel these
# machines carry; elsewhere e.g. TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
# (CPU) or TORCH="torch==2.13.0" on a CUDA machine. See README, "Choosing a torch build".
VENV  ?= .venv
TORCH ?= torch==2.13.0
PY    := $(VENV)/bin/python
EXTRAS ?= dev

.PHONY: setup system-tools bytecode run test reports reports-fault-zoo reports-economics reports-museum reports-gzip
setup: $(VENV)/.kvparity-installed

$(VENV)/.kvparity-installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	@$(MAKE) --no-print-directory system-tools
	touch $@

# The system programs some tests drive for real, as `command:Debian package`: headless Chromium
# (tests/test_report_browser.py, tests/test_lane_diagram.py: report.html in a real browser) and redis-server
# (tests/test_shards.py: a campaign's shared example database, issue 32). Installed only where that is ours
# to do — root with apt-get (CI's container) — and never fatal: without one, its tests are skipped and say why.
SYSTEM_TOOLS := chromium:chromium redis-server:redis-server
system-tools:
	@for tool in $(SYSTEM_TOOLS); do cmd=$${tool%%:*}; pkg=$${tool#*:}; \
	  if command -v $$cmd >/dev/null 2>&1; then :; \
	  elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkg >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$pkg >/dev/null 2>&1; } || \
	    echo "$$pkg not installed: the tests that need $$cmd will be skipped"; \
	  else echo "no $$cmd (needs root and apt-get to install): the tests that need it will be skipped"; fi; done

run: setup
	$(VENV)/bin/kvparity run --engine reference --profile ci

# Our modules' bytecode, written once before the tests: where PYTHONDONTWRITEBYTECODE is set (CI containers,
# these machines) Python never caches it, and each of the ~270 processes of a test session that import ours
# (`kvparity run` children, shards, plugin sessions; counted 2026-12-08) compiled them anew: ~0.2 s of CPU
# each (a 2-example fake-engine run: 0.71-1.07 s of user CPU without, 0.58-0.71 s with). Up-to-date files
# are skipped.
bytecode: setup
	$(PY) -m compileall -q conformance adapters reference_engine kvparity tests >/dev/null

test: setup system-tools bytecode
	$(PY) -m pytest -n 2 -q -m "not slow" --durations=15 tests

test-slow: setup system-tools bytecode  # the long sweeps (issue 32): every zoo fault, the dev-run finding-first check per fault, the transformers finding regression, and the long end-to-end paths whose rule CI proves in a smaller test (zoo shrinking bar, mutate's path to equivalent, the shipped checkpoint's landmark search, a dev run's progress log)
	$(PY) -m pytest -n 2 -q -m slow tests

# Regenerating the committed reports is explicit: user runs of `kvparity fault-zoo` / `kvparity bench`
# write under .kvparity/ (git-ignored). These reproduce reports/fault-zoo.md (27 faults x 5 seeds, ci profile,
# 60 s shrink cap, about 52 min on one core; its hand-written notes, from "## What it took" on, are carried over)
# and reports/economics/ (reference engine, full size, k = 4).
ZOO_NOTES := .kvparity/fault-zoo-notes.md

reports: reports-fault-zoo reports-economics

# The bug museum (reports/museum.md): builds one venv per engine release under .kvparity/venvs (GBs; hours).
reports-museum: setup
	$(VENV)/bin/kvparity museum --runs reports/museum --out reports/museum.md
	@$(MAKE) --no-print-directory reports-gzip

# Committed run folders keep their history gzipped (history.jsonl.gz: every reader of a stored run folder
# reads it, conformance/history_files.py); report.html and junit.xml are git-ignored (`kvparity report
# RUN_DIR` writes them again). Run this after copying a run folder into reports/<engine>/<label>/.
reports-gzip:
	find reports -name history.jsonl -type f -exec gzip -9 -n -f {} +

reports-fault-zoo: setup
	mkdir -p $(dir $(ZOO_NOTES))
	sed -n '/^## What it took/,$$p' reports/fault-zoo.md > $(ZOO_NOTES)
	$(VENV)/bin/kvparity fault-zoo --out reports/fault-zoo.md --profile ci --max-shrink-seconds 60 --notes $(ZOO_NOTES)

reports-economics: setup
	$(VENV)/bin/kvparity bench --engine reference --size full --k 4 --out reports/economics

# Standalone reproducers (`kvparity export`; they import no kvparity) are generated on demand, not
# committed: `make reproducers` writes one per fault-zoo witness and one per real finding's witness into
# $(REPRODUCERS_DIR) (git-ignored), folder = the report's. Only PUBLIC_REPRODUCERS are committed, under
# reproducers/, because a report links them as the public statement of a finding; `make
# reproducers-public` rewrites them and tests/test_export.py checks they are current.
.PHONY: reproducers reproducers-public
REPRODUCERS_DIR ?= .kvparity/reproducers
# engine folder:witness of each real finding (the public set below, and the rest)
REPRODUCE := transformers:reports/transformers/20261130-145852/witnesses/parity-f291db0373.json \
	transformers:reports/transformers/20261130-145852/witnesses/exercised-0379084d2b.json \
	vllm:reports/vllm/lora-20261130-140204/witnesses/parity-40e0b84fa8.json \
	vllm:reports/vllm/probes/lora-pair.json \
	openai_http-vllm:reports/openai_http-vllm/20261130-141329/witnesses/parity-79a90c248c.json \
	llama_cpp:reports/llama_cpp/shared-cache/witnesses/isolation-a92c06de03.json \
	llama_cpp:reports/llama_cpp/shared-cache/witnesses/prefix_only-f608ec1770.json \
	llama_cpp:reports/llama_cpp/shared-ram-parity/witnesses/parity-4006517376.json
# The public set (committed, reproducers/<folder>/<witness>.py), one line each for why it is public:
#   vllm/lora-pair: vLLM finding 1 (a base request batched with LoRA requests gets a LoRA applied), the
#     minimal case that fails every run (reports/vllm/README.md; docs/running.md, "Reproducers that need no kvparity")
#   openai_http-vllm/parity-79a90c248c: the same finding through vLLM's OpenAI server, stdlib only, failed
#     2/2 (reports/openai_http-vllm/README.md)
#   transformers/parity-f291db0373: transformers F1, a persistent manager keeps its first stop ids
#     (reports/transformers/README.md)
#   transformers/exercised-0379084d2b: transformers F2, a prefill-only request never publishes its blocks
#   llama_cpp/isolation-a92c06de03: llama.cpp F1, one prompt cache across identities
#     (reports/llama_cpp/README.md; its parity face, parity-4006517376, is `make reproducers` only)
#   llama_cpp/prefix_only-f608ec1770: llama.cpp F4, a repeated prompt reported cached in full
PUBLIC_REPRODUCERS := vllm:reports/vllm/probes/lora-pair.json \
	openai_http-vllm:reports/openai_http-vllm/20261130-141329/witnesses/parity-79a90c248c.json \
	transformers:reports/transformers/20261130-145852/witnesses/parity-f291db0373.json \
	transformers:reports/transformers/20261130-145852/witnesses/exercised-0379084d2b.json \
	llama_cpp:reports/llama_cpp/shared-cache/witnesses/isolation-a92c06de03.json \
	llama_cpp:reports/llama_cpp/shared-cache/witnesses/prefix_only-f608ec1770.json

reproducers: setup
	mkdir -p $(REPRODUCERS_DIR)/fault-zoo
	for w in reports/fault-zoo/witnesses/*.json; do \
	  $(VENV)/bin/kvparity export $$w --out $(REPRODUCERS_DIR)/fault-zoo/$$(basename $$w .json).py || exit 1; done
	for pair in $(REPRODUCE); do d=$${pair%%:*}; w=$${pair#*:}; mkdir -p $(REPRODUCERS_DIR)/$$d; \
	  $(VENV)/bin/kvparity export $$w --out $(REPRODUCERS_DIR)/$$d/$$(basename $$w .json).py || exit 1; done

reproducers-public: setup
	for pair in $(PUBLIC_REPRODUCERS); do d=$${pair%%:*}; w=$${pair#*:}; mkdir -p reproducers/$$d; \
	  $(VENV)/bin/kvparity export $$w --out reproducers/$$d/$$(basename $$w .json).py || exit 1; done
