"""``python -m allot.services.agent``."""

from allot.services.agent.service import main

raise SystemExit(main())
