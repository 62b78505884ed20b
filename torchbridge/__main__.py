"""`python -m torchbridge {info,build}`: see `torchbridge._cli`."""

import sys

from torchbridge import _cli

if __name__ == "__main__":
  sys.exit(_cli.main())
