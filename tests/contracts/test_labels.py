"""Labels outside their documented set: {-1, +1} where {0, 1} is meant, motif's {0, 1, 2}, class ids >=
num_classes, label states outside [0, C]. A named `LabelError` eagerly and under `iclr24_jax.checked`; NaN out
(or the documented sentinel) under jit / vmap; never read as another label."""
import jax
import numpy as np
import pytest

from iclr24_jax.common import checks
from tests.contracts import helpers as C

CPM, MOTIF, MDM, PMP, LDCQ, SG, FAM = C.cpm, C.motif, C.mdm, C.pmp, C.ldcq, C.safeguards, C.families


def _motif(labels):
  return lambda: (MOTIF()["m1"], MOTIF()["m2"], np.asarray(labels))


CASES = [
    # cpm.fit with {-1, +1} fitted different weights than {0, 1}, silently; the convention is {0, 1}, documented.
    C.Case("cpm.fit labels {-1,+1}", (CPM, "fit"), lambda: (*C.cpm_data()[:2], 2 * C.cpm_data()[2] - 1),
           C.Value(checks.LabelError)),
    C.Case("cpm.fit labels 2", (CPM, "fit"), lambda: (*C.cpm_data()[:2], C.with_entry(C.cpm_data()[2], 0, 2)),
           C.Value(checks.LabelError)),
    # motif read 5 and -1 as "no preference"; 3 (the official UNKOWN) is dropped officially, not a tie.
    C.Case("motif.preference_loss label 5", (MOTIF, "loss"), _motif([0, 5, 1]), C.Value(checks.LabelError)),
    C.Case("motif.preference_loss label -1", (MOTIF, "loss"), _motif([0, -1, 1]), C.Value(checks.LabelError)),
    C.Case("motif.preference_loss label 3 (UNKOWN)", (MOTIF, "loss"), _motif([0, 3, 1]), C.Value(checks.LabelError)),
    C.Case("motif.preference_loss float label 0.5", (MOTIF, "loss"), _motif(np.array([0.0, 0.5, 1.0], C.F32)),
           C.Value(checks.LabelError)),
    # mdm: labels >= num_classes gave NaN (7) or silently the null label (3).
    C.Case("mdm.loss_fn label == num_classes", (MDM, "loss_plain"), lambda: (MDM()["x"], np.array([0, 3], np.int32)),
           C.Value(checks.LabelError)),
    C.Case("mdm.loss_fn label -1", (MDM, "loss_plain"), lambda: (MDM()["x"], np.array([-1, 0], np.int32)),
           C.Value(checks.LabelError)),
    # pmp clamped label states under jit.
    C.Case("pmp.partition_messages label_state 5", (PMP, "partition"),
           lambda: (PMP()["senders"], PMP()["receivers"], PMP()["h"], C.with_entry(PMP()["state"], 0, 5)),
           C.Value(checks.LabelError)),
    C.Case("pmp.auc_roc labels {-1,1}", (PMP, "auc"),
           lambda: (np.array([0.1, 0.8, 0.6, 0.3], C.F32), np.array([-1, 1, 1, -1])), C.Value(checks.LabelError)),
    C.Case("ldcq.q_target dones 2", (LDCQ, "target"), lambda: C.ldcq_args(d=np.array([0, 2, 0, 0], C.F32)),
           C.Value(checks.LabelError)),
    C.Case("safeguards.coverage_accuracy y=2", (SG, "coverage_08"),
           lambda: (np.array([0.9, 0.2, 0.6], C.F32), np.array([2, 0, 1])), C.Value(checks.LabelError)),
    C.Case("graphcare.task_loss binary labels 2", (FAM, "task_loss"),
           lambda: (np.zeros((3, 1), C.F32), np.array([0, 2, 1])), C.Value(checks.LabelError)),
    # dtypes are structure: float class ids and float label states are refused at trace time.
    C.Case("mdm.loss_fn float labels", (MDM, "loss_plain"), lambda: (MDM()["x"], np.array([0.0, 1.0], C.F32)),
           C.Structural(checks.DtypeError)),
    C.Case("pmp.partition_messages float label_state", (PMP, "partition"),
           lambda: (PMP()["senders"], PMP()["receivers"], PMP()["h"], PMP()["state"].astype(C.F32)),
           C.Structural(checks.DtypeError)),
]


@pytest.mark.parametrize("case,mode", C.params(CASES))
def test_labels(case, mode):
  C.check_case(case, mode)


def test_cpm_zero_one_labels_fit_is_unchanged():
  # The accepted convention still fits: {0, 1} labels give finite weights in every mode.
  fa, fb, y = C.cpm_data()
  w = np.asarray(CPM()["fit"](fa, fb, y))
  assert np.isfinite(w).all() and w[0] > 0     # feature 0 decides the synthetic preference


def test_vision_cross_entropy_labels_in_range():
  # A one-hot of label 3 with K = 3 is all zeros: without the check it would count as a loss of 0.
  from iclr24_jax.vision import classify
  logits = np.zeros((2, 3), np.float32)
  assert float(classify.cross_entropy(logits, np.array([0, 2]))) == pytest.approx(np.log(3.0))   # uniform: ln 3
  with pytest.raises(checks.ContractError, match="labels"):
    classify.cross_entropy(logits, np.array([0, 3]))
  assert np.isnan(float(jax.jit(classify.cross_entropy)(logits, np.array([0, 3]))))
