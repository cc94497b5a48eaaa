"""`python -m benchmarks.goodput`: see benchmarks/goodput/compare.py."""

import sys

from benchmarks.goodput.compare import main

sys.exit(main())
