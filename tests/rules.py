"""The rule ids of the model (SEMANTICS.md), pinned once for the tests that check the docs and
the notebooks name every rule."""

from __future__ import annotations

import re

#: S0 (call budget) 12, S2 (grants) 9, S3 (task limits) 10 and S4 (run limits) 12: 43 in all
SEMANTIC_RULE_IDS = (
    [f"S0-{n}" for n in range(1, 13)]
    + [f"S2-{n}" for n in range(1, 10)]
    + [f"S3-{n}" for n in range(1, 11)]
    + [f"S4-{n}" for n in range(1, 13)]
)
#: the rules of how the model meets Jupyter
NOTEBOOK_RULE_IDS = ["N-1", "N-2", "N-3", "N-4", "N-5", "N-6", "N-7"]
ALL_RULE_IDS = SEMANTIC_RULE_IDS + NOTEBOOK_RULE_IDS
#: a rule id, whole: S0-1 must not match inside S0-12
RULE_ID = re.compile(r"\b(?:S[0234]|N)-\d+(?!\d)")
