"""``python -m allot.services.placement``."""

from allot.services.placement.service import main

raise SystemExit(main())
