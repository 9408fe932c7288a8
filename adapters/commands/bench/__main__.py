"""`python -m adapters.commands.bench` = `kvparity bench`."""

from adapters.commands.bench import main

raise SystemExit(main())
