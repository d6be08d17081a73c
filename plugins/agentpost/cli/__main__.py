"""``python -m agentpost.cli``: the console script without its installed wrapper (tests and
subprocesses run the CLI of the interpreter they run on)."""

import sys

from agentpost.cli import main

sys.exit(main())
