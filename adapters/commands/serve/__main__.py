"""`python -m adapters.commands.serve` = `kvparity serve` (how the HTTP adapter starts it)."""

from adapters.commands.serve import main

raise SystemExit(main())
