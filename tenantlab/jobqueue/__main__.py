"""Run ``python -m tenantlab.jobqueue`` (deprecated): ``jobqueue``'s command line, one line said."""

import sys

from jobqueue.cli import main

print("python -m tenantlab.jobqueue is deprecated and goes in the next release: run `jobqueue` "
      "(or python -m jobqueue), the same commands", file=sys.stderr)
raise SystemExit(main())
