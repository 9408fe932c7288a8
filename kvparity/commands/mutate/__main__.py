"""`python -m kvparity.commands.mutate`: the same as `kvparity mutate`."""

from __future__ import annotations

from kvparity.commands.mutate import main

raise SystemExit(main())
