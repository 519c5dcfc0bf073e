"""Empty batches: a named `EmptyInputError` at trace time where at least one row is needed (motif: was a
ZeroDivisionError; mdm: was NaN), and a well-defined empty result where nothing is asked for (d2pruning's
budget 0: was an IndexError)."""
import numpy as np
import pytest

from iclr24_jax.common import checks
from tests.contracts import helpers as C

MOTIF, MDM, CPM, D2, LM = C.motif, C.mdm, C.cpm, C.d2pruning, C.lm

CASES = [
    C.Case("motif.preference_loss 0 pairs", (MOTIF, "loss"),
           lambda: (MOTIF()["m1"][:0], MOTIF()["m2"][:0], np.zeros((0,), np.int32)),
           C.Structural(checks.EmptyInputError)),
    C.Case("mdm.loss_fn 0 images", (MDM, "loss_plain"), lambda: (MDM()["x"][:0], np.zeros((0,), np.int32)),
           C.Structural(checks.EmptyInputError)),
    C.Case("cpm.fit 0 pairs", (CPM, "fit"), lambda: tuple(a[:0] for a in C.cpm_data()),
           C.Structural(checks.EmptyInputError)),
    C.Case("lm.choice_logprobs_ids prompt row without a real token", (LM, "choice"),
           lambda: (np.array([[5, 6, 7]], np.int32), np.zeros((1, 3), bool), np.array([[9, 10]], np.int32),
                    np.ones((1, 2), bool)), C.Value(checks.EmptyInputError)),
    C.Case("d2pruning.reverse_message_passing_select budget 0", (D2, "select0"), lambda: (D2()["scores"],),
           C.Accepted(lambda out: out.shape == (0,))),
    C.Case("d2pruning.kcenter_greedy budget 0", (D2, "kcenter0"), lambda: (D2()["emb"],),
           C.Accepted(lambda out: out.shape == (0,))),
]


@pytest.mark.parametrize("case,mode", C.params(CASES))
def test_empty(case, mode):
  C.check_case(case, mode)
