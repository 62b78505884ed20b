"""Runners: how a module's calls run, and the choice between them.

Knows the runners of one module's graph calls: the choice (`_choose`:
`run=`, auto -> the TF translation -> torch from C++ -> torch on the
Python path; eager calls always take the Python path, the bridge), one
file per captured runner (`_tf_runner`, `_torch_runner`), and the record
of what each module took (`_record`, for `info` and `tb.timeline()`).
Never imports Keras or Ray.

May import: _capture, _state, _call, _native, _crossing, _runtime, _translate, _frameworks.
"""

from torchbridge._runners._choose import Runners
from torchbridge._runners._choose import check_run
from torchbridge._runners._choose import resolve_run

__all__ = ["Runners", "check_run", "resolve_run"]
