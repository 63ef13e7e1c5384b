"""A pytest plugin for nbval on the teaching notebooks (``bash scripts/notebooks.sh`` loads it
with ``-p nbbudget_nbval``, this folder on ``PYTHONPATH``).

nbval sanitises text outputs only; a ``%%budget --detach``/``--resume`` cell also carries its
response envelope as JSON (``application/vnd.nbbudget.response+json``), whose ``duration_ms``
is the call's real duration. Compare such outputs as canonical JSON text, with the same
sanitising patterns (``sanitize.cfg`` beside this file) as every other output.
"""

from __future__ import annotations

import json

try:
    from nbval.plugin import IPyNbCell
except ImportError:  # pytest without nbval: there is nothing to compare
    IPyNbCell = None

if IPyNbCell is not None:
    _sanitize_text = IPyNbCell.sanitize

    def _sanitize(self: object, s: object) -> object:
        if isinstance(s, (dict, list)):
            s = json.dumps(s, sort_keys=True)
        return _sanitize_text(self, s)

    IPyNbCell.sanitize = _sanitize
