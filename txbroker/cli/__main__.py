"""`python -m txbroker.cli`, as the `txbroker` command."""

import sys

from txbroker.cli import main

sys.exit(main())
