"""`python -m torchbridge {info,build}`: see `torchbridge._cli`."""

import sys

from torchbridge import _cli

sys.exit(_cli.main())
