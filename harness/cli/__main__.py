"""`python -m harness.cli ...`: the `harness` command without the installed script."""

import sys

from harness.cli.main import main

sys.exit(main())
