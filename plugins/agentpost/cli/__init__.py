"""The `agentpost` command line: `main` is the console script's entry point.

Every command finds its store the same way (`agentpost.cli.common`). Errors print one line
to stderr and exit non-zero: 1 for a failed check (verify) or a rejected envelope, 2 for bad
usage or input, 3 when the store cannot be reached or is misconfigured. An error about
something missing (an unknown workspace, command, ...) names the store it looked in.

`agentpost.cli.parser` builds the parser from the command groups, one module each
(`envelopes`, `trail`, `leases`, `rules`, `commands`, `routes`, ...), which all share
`agentpost.cli.common` and nothing else of one another.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Callable, Sequence

from agentpost.cli.common import error_line, exit_code
from agentpost.cli.parser import build_parser
from agentpost.protocol.errors import AgentpostError

__all__ = ["build_parser", "main"]


def one_line_warning(message: Warning | str, *args: object, **kwargs: object) -> str:
    """A warning as one line of stderr, like the CLI's errors."""
    return f"agentpost: warning: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (see the module docstring)."""
    warnings.formatwarning = one_line_warning
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        code = func(args)
        sys.stdout.flush()  # a closed pipe shows here, inside the try, not at shutdown
        return code
    except AgentpostError as exc:
        print(error_line(args, exc), file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`agentpost trail | head`): stop quietly, as a Unix tool does;
        # stdout is pointed at /dev/null so the interpreter's final flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
