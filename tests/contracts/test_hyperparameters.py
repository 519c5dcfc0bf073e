"""Hyperparameters outside their range. A Python number is structure: a named `HyperparameterError` at trace
time in every mode. A traced one (a swept discount, a jitted sigma) is a value: named eagerly and under
`iclr24_jax.checked`, NaN out under jit / vmap."""
import jax
import numpy as np
import pytest

from iclr24_jax.common import checks
from tests.contracts import helpers as C

LDCQ, CPM, MDM, D2, SG, FPS, FAM = C.ldcq, C.cpm, C.mdm, C.d2pruning, C.safeguards, C.fps, C.families

CASES = [
    C.Case("ldcq.q_target discount=1.5", (LDCQ, "target_15"), lambda: C.ldcq_args(),
           C.Structural(checks.HyperparameterError)),
    C.Case("ldcq.q_target traced discount 1.5", (LDCQ, "target_discount"), lambda: (*C.ldcq_args(), np.float32(1.5)),
           C.Value(checks.HyperparameterError)),
    C.Case("ldcq.q_target traced discount -0.1", (LDCQ, "target_discount"),
           lambda: (*C.ldcq_args(), np.float32(-0.1)), C.Value(checks.HyperparameterError)),
    C.Case("cpm.fit traced C=-1", (CPM, "fit_c"), lambda: (*C.cpm_data(), np.float32(-1.0)),
           C.Value(checks.HyperparameterError)),
    C.Case("cpm.fit traced C=0", (CPM, "fit_c"), lambda: (*C.cpm_data(), np.float32(0.0)),
           C.Value(checks.HyperparameterError)),
    C.Case("mdm.loss_fn cond_drop_prob=2", (MDM, "loss_drop2"), lambda: (MDM()["x"], np.array([0, 1], np.int32)),
           C.Structural(checks.HyperparameterError)),
    C.Case("d2pruning.forward_message_passing gamma=-1", (D2, "forward_neg"), lambda: (D2()["scores"],),
           C.Structural(checks.HyperparameterError)),
    C.Case("safeguards.coverage_accuracy tau=0.3", (SG, "coverage_03"),
           lambda: (np.array([0.9, 0.2, 0.6], C.F32), np.array([1, 0, 1])), C.Structural(checks.HyperparameterError)),
    C.Case("safeguards.coverage_accuracy traced tau=0.3", (SG, "coverage"),
           lambda: (np.array([0.9, 0.2, 0.6], C.F32), np.array([1, 0, 1]), np.float32(0.3)),
           C.Value(checks.HyperparameterError)),
    C.Case("safeguards.choose_threshold traced target=1.5", (SG, "choose"),
           lambda: (np.array([0.9, 0.2, 0.6], C.F32), np.array([1, 0, 1]), np.float32(1.5)),
           C.Value(checks.HyperparameterError)),
    C.Case("fps.sample traced sigma=-1", (FPS, "sample"), lambda: (np.array([0.4], C.F32), np.float32(-1.0)),
           C.Value(checks.HyperparameterError)),
    C.Case("coboosting.kd_loss traced temperature=0", (FAM, "kd"),
           lambda: (np.ones((2, 3), C.F32), np.zeros((2, 3), C.F32), np.float32(0.0)),
           C.Value(checks.HyperparameterError)),
    C.Case("unio4.expectile_loss expectile=1.5", (FAM, "expectile"), lambda: (np.ones(3, C.F32),),
           C.Structural(checks.HyperparameterError)),
    C.Case("rl.gae traced gamma=1.5", (FAM, "gae"), lambda: (np.ones((4, 2), C.F32), np.zeros((4, 2), C.F32),
                                                             np.float32(1.5)), C.Value(checks.HyperparameterError)),
]


@pytest.mark.parametrize("case,mode", C.params(CASES))
def test_hyperparameters(case, mode):
  C.check_case(case, mode)


@pytest.mark.parametrize("call", [
    lambda: C.cpm()["cpm"].fit(*C.cpm_data(), C=-1.0),
    lambda: C.d2pruning()["d2"].select_coreset(C.d2pruning()["emb"], C.d2pruning()["scores"], 0.5,
                                               gamma_reverse=-0.1),
    lambda: C.ldcq()["ldcq"].QConfig(C.ldcq()["ldcq"].QNetwork(8, (8,)), discount=1.5),
    lambda: C.lm_inversion()["li"].update_unigram(np.zeros(10, C.F32), C.log_distributions(), decay=1.5),
], ids=["cpm.fit C<0", "d2pruning.select_coreset gamma<0", "ldcq.QConfig discount", "lm_inversion decay"])
def test_python_hyperparameters_raise_at_once(call):
  with pytest.raises(checks.HyperparameterError, match="must be"):
    call()


def test_mario_quark_loss_coefficients():
  # quark_loss checks its coefficients before touching the model: a negative Python coefficient raises at once
  # (no model is needed to see it), and a traced one out of range poisons the loss and every metric.
  from iclr24_jax.lm import llama
  from iclr24_jax.papers import mario
  cfg = llama.LlamaConfig(vocab_size=16, hidden_size=8, num_layers=1, num_heads=2, num_kv_heads=2,
                          intermediate_size=16, max_seq_len=8)
  with pytest.raises(checks.HyperparameterError, match="kl_coef must be >= 0"):
    mario.quark_loss({}, cfg, {}, {}, kl_coef=-0.1)
  params = llama.init_params(jax.random.key(0), cfg)
  ids = np.array([[1, 2, 3, 4]], np.int32)
  batch = dict(ids=ids, mask=np.ones_like(ids, bool), loss_mask=np.array([[0, 1, 1, 1]], bool),
               code_mask=np.array([[1, 0, 0, 0]], bool))
  loss_at = jax.jit(lambda c: mario.quark_loss(params, cfg, batch, params, kl_coef=c))
  good, bad = loss_at(0.1), loss_at(-0.1)
  assert np.isfinite(good[0]) and np.isfinite(good[1]["nll"])
  assert C.all_nan(bad)


def test_mario_assign_bins_accuracy_must_be_zero_one():
  from iclr24_jax.papers import mario
  codes = mario.ControlCodes(ids=(10, 11), rewards=(), num_bins=5, accuracy=True)
  assert mario.assign_bins({"accuracy": [1.0, 0.0]}, codes)["accuracy"].tolist() == [0, 1]   # 0 = correct bin
  with pytest.raises(checks.LabelError, match="0 / 1"):
    mario.assign_bins({"accuracy": [1.0, float("nan")]}, codes)
