"""`python -m conformance ...` is the `kvparity` command (the supervisor starts its child this way)."""

from conformance.cli import console_main

console_main()
