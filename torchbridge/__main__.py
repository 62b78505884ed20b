"""`python -m torchbridge {info,build}`: see `torchbridge._cli._commands`."""

import sys

from torchbridge._cli import _commands

if __name__ == "__main__":
  sys.exit(_commands.main())
