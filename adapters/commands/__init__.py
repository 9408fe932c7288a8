"""The engine-driving commands of `kvparity` (entry-point group `kvparity.commands`): `bench/`
(`kvparity bench`, the economics report), `fault_zoo.py` (`kvparity fault-zoo`), `export_gguf.py`
(`kvparity export-gguf`), the argument parsing they share (`cli.py`), and `thirdparty.sh`, which runs the
vLLM suites in their own venv. They live under adapters/ because they build engines; `conformance`
reaches them only through the entry points.
"""
