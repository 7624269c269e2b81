"""`python -m zerolite.cli ...` works like the `zerolite` command."""
import sys

from zerolite.cli import main

sys.exit(main())
