"""`python -m adapters.commands.mutate`: the same as `kvparity mutate`."""

from __future__ import annotations

from adapters.commands.mutate import main

raise SystemExit(main())
