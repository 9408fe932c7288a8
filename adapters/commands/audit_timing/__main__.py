"""`python -m adapters.commands.audit_timing` = `kvparity audit-timing`."""

from adapters.commands.audit_timing import main

raise SystemExit(main())
