"""Integer indices out of range (graph node ids, pair indices, token ids): a named `IndexRangeError` eagerly and
under `iclr24_jax.checked`; NaN out under jit / vmap instead of a gather that silently clamps or drops."""
import numpy as np
import pytest

from iclr24_jax.common import checks
from tests.contracts import helpers as C

PMP, MOTIF, LM, FAM = C.pmp, C.motif, C.lm, C.families


def _pmp(**over):
  d = {k: PMP()[k] for k in ("senders", "receivers", "h", "state")}
  d.update(over)
  return lambda: (d["senders"], d["receivers"], d["h"], d["state"])


CASES = [
    # pmp ran with sender 100 on a 12-node graph (clamped to node 11 under jit) and receiver -1 (dropped).
    C.Case("pmp.partition_messages sender 100", (PMP, "partition"),
           lambda: _pmp(senders=C.with_entry(PMP()["senders"], 0, 100))(), C.Value(checks.IndexRangeError)),
    C.Case("pmp.partition_messages receiver -1", (PMP, "partition"),
           lambda: _pmp(receivers=C.with_entry(PMP()["receivers"], 0, -1))(), C.Value(checks.IndexRangeError)),
    C.Case("pmp.sage_messages sender 12", (PMP, "sage"),
           lambda: (C.with_entry(PMP()["senders"], 3, 12), PMP()["receivers"], PMP()["h"]),
           C.Value(checks.IndexRangeError)),
    C.Case("motif.preference_loss pair index 7 of 3 messages", (MOTIF, "loss_pairs"),
           lambda: (MOTIF()["m1"], np.array([[0, 1], [1, 7]], np.int32), np.array([0, 1], np.int32)),
           C.Value(checks.IndexRangeError)),
    C.Case("lm.choice_logprobs_ids option id >= vocab", (LM, "choice"),
           lambda: (np.array([[5, 6, 7]], np.int32), np.ones((1, 3), bool), np.array([[9, 1000]], np.int32),
                    np.ones((1, 2), bool)), C.Value(checks.IndexRangeError)),
    C.Case("lm.token_logprobs id -1", (LM, "token"), lambda: (np.array([[5, -1, 7]], np.int32),),
           C.Value(checks.IndexRangeError)),
    C.Case("coboosting.hard_sample_loss label 5 of 3 classes", (FAM, "hard"),
           lambda: (np.zeros((2, 3), C.F32), np.array([0, 5], np.int32)), C.Value(checks.IndexRangeError)),
    # daclip's IR-SDE tables: a time past T was clamped to the last step by the gather
    C.Case("daclip.irsde_std t=15 with T=10", (FAM, "irsde_std"), lambda: (np.array([3, 15], np.int32),),
           C.Value(checks.IndexRangeError, C.has_nan)),
    # a float node id is structure (dtype), refused at trace time
    C.Case("pmp.partition_messages float senders", (PMP, "partition"),
           lambda: _pmp(senders=PMP()["senders"].astype(C.F32))(), C.Structural(checks.DtypeError)),
]


@pytest.mark.parametrize("case,mode", C.params(CASES))
def test_indices(case, mode):
  C.check_case(case, mode)
