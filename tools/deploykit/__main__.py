"""`python -m deploykit`: the same command line as `deploykit`."""

import sys

from deploykit.cli import main

sys.exit(main())
