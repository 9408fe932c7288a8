"""The `kvparity` command line: the one layer allowed to import everything (conformance, adapters,
reference_engine), as pytest's `src/pytest/` faces `_pytest/`. `cli` is the one dispatcher;
`commands/<name>` holds one peer module or package per subcommand; `parsing` is the argument parsing they
share. Nothing under conformance/, adapters/ or reference_engine/ imports this package."""
