"""`python -m kvparity.commands.bench` = `kvparity bench`."""

from kvparity.commands.bench import main

raise SystemExit(main())
