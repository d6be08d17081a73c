"""``python -m agentpost.cli``: the console script without its installed wrapper (tests and
subprocesses run the CLI of the interpreter they run on). Importing it runs nothing: tools
that import every module of the package (tests/airflow/test_provider_info.py) walk past it."""

import sys

from agentpost.cli import main

if __name__ == "__main__":
    sys.exit(main())
