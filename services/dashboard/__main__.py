"""``python -m allot.services.dashboard``."""

from allot.services.dashboard.service import main

raise SystemExit(main())
