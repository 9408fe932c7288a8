"""One peer module or package per `kvparity` subcommand. Each has a module docstring whose first
paragraph is its `--help` description, and `main(argv) -> int` (the built-in ones also take the process's
`Session`); `kvparity.cli.BUILTIN` names them, third-party commands join through the entry-point group
`kvparity.commands`."""
