"""`python -m deploykit`: the same command line as `deploykit`."""

import sys

from .cli import main

sys.exit(main())
