"""Ray itself, imported here so that a missing install gets an error naming the fix."""

try:
  import ray
except ImportError as err:
  raise ImportError(
    "torchbridge.ray needs Ray, which is not installed in this environment "
    f"({err}). Install it: `pip install ray` (or, in a clone of torchbridge, "
    '`pip install ".[ray]"`). The rest of torchbridge works without it.'
  ) from err

__all__ = ["ray"]
