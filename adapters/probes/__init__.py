"""Direct probes behind the findings in reports/: one module per engine, each driving the engine's own
API (no kvparity runner) and printing what it saw. Run from the repository root:

    python -m adapters.probes.transformers stop-ids | prefill-only
    python -m adapters.probes.llama_cpp cache-cross-revision | server-disk-cache | spec-crash | ...
    .venv-vllm/bin/python -m adapters.probes.vllm tolerance | salt | lora | lora-pair | ... | all

Run them with `-m`, not as a file path: a module named after its engine (`transformers.py`, `vllm.py`)
run as a script would shadow the engine's own package.
"""
