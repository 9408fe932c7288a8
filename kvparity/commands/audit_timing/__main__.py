"""`python -m kvparity.commands.audit_timing` = `kvparity audit-timing`."""

from kvparity.commands.audit_timing import main

raise SystemExit(main())
