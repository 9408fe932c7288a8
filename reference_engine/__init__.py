"""The reference engine: a deliberately simple, real inference engine and kvparity's ground truth.

Imports nothing from `conformance` or `adapters`. Start with model.py (the transformer), baseline.py
(plain greedy decoding, the definition of "correct"), then the engine files.
"""
