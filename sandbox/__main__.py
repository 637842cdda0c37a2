"""`python -m sandbox [serve] --host 127.0.0.1 --port N ...` (same options as `agentrl sandbox serve`)."""

import sys

from sandbox.cli import main

sys.exit(main())
