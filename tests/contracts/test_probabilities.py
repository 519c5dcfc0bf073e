"""Probabilities outside [0, 1] (or NaN) and log-probabilities that are not distributions: a named error eagerly
and under `iclr24_jax.checked`, NaN out under jit / vmap (never a clamped, finite answer)."""
import numpy as np
import pytest

from iclr24_jax.common import checks
from tests.contracts import helpers as C

P = C.safeguards
LI = C.lm_inversion

CASES = [
    # safeguards under jit gave Pr(y=1) = 1.025 for p = 1.7 (a clamp): now NaN.
    C.Case("safeguards.propagate p=1.7", (P, "propagate"),
           lambda: (C.with_entry(P()["p"], (0, 1), 1.7),), C.Value(checks.ProbabilityError)),
    C.Case("safeguards.propagate p=-0.2", (P, "propagate"),
           lambda: (C.with_entry(P()["p"], (1, 0), -0.2),), C.Value(checks.ProbabilityError)),
    C.Case("safeguards.propagate mc p=1.7", (P, "propagate_mc"),
           lambda: (C.with_entry(P()["p"], (0, 0), 1.7),), C.Value(checks.ProbabilityError)),
    C.Case("safeguards.coverage_accuracy y_bar=1.4", (P, "coverage_08"),
           lambda: (np.array([1.4, 0.2, 0.6], C.F32), np.array([1, 0, 1])), C.Value(checks.ProbabilityError)),
    # confirm's output is a bool mask: the documented sentinel is 'confirm nothing'.
    C.Case("safeguards.confirm p=1.7", (P, "confirm"),
           lambda: (C.with_entry(P()["p"], (0, 0), 1.7),), C.Value(checks.ProbabilityError, C.all_equal(False))),
    # logits passed where log-probabilities are meant (rows carry more than all the mass)
    C.Case("lm_inversion.unroll logits", (LI, "unroll"), lambda: (C.log_distributions() + 5.0,),
           C.Value(checks.ProbabilityError)),
    C.Case("lm_inversion.update_unigram logits", (LI, "update"),
           lambda: (np.zeros(10, C.F32), C.log_distributions() + 5.0), C.Value(checks.ProbabilityError)),
]


@pytest.mark.parametrize("case,mode", C.params(CASES))
def test_probabilities(case, mode):
  C.check_case(case, mode)
