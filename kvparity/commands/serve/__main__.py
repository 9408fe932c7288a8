"""`python -m kvparity.commands.serve` = `kvparity serve` (how the HTTP adapter starts it)."""

from kvparity.commands.serve import main

raise SystemExit(main())
