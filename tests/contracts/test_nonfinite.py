"""NaN / Inf inputs. Where finite values are required (concept probabilities, features, scores, measurements)
a named `NonFiniteError` eagerly and under `iclr24_jax.checked`, and under jit / vmap an output that is NaN (or
the documented -1 sentinel), never a finite number computed from a clamped NaN. -inf log-probabilities are a
valid input to lm_inversion (a masked / top-k distribution): finite pseudo-embeddings, as the official code."""
import numpy as np
import pytest

from iclr24_jax.common import checks
from tests.contracts import helpers as C

SG, CPM, PMP, LI, D2, FPS, LDCQ = C.safeguards, C.cpm, C.pmp, C.lm_inversion, C.d2pruning, C.fps, C.ldcq

CASES = [
    # safeguards under jit gave Pr(y = 1) = 0.000 for a NaN probability.
    C.Case("safeguards.propagate NaN", (SG, "propagate"), lambda: (C.with_entry(SG()["p"], (0, 1), np.nan),),
           C.Value(checks.NonFiniteError)),
    C.Case("cpm.fit NaN feature", (CPM, "fit"), lambda: (C.with_entry(C.cpm_data()[0], (2, 1), np.nan),
                                                         *C.cpm_data()[1:]), C.Value(checks.NonFiniteError)),
    C.Case("pmp.partition_messages NaN feature", (PMP, "partition"),
           lambda: (PMP()["senders"], PMP()["receivers"], C.with_entry(PMP()["h"], (0, 0), np.nan), PMP()["state"]),
           C.Value(checks.NonFiniteError)),
    C.Case("lm_inversion.unroll NaN", (LI, "unroll"), lambda: (C.with_entry(C.log_distributions(), (0, 3), np.nan),),
           C.Value(checks.NonFiniteError)),
    C.Case("lm_inversion.unroll +inf", (LI, "unroll"), lambda: (C.with_entry(C.log_distributions(), (0, 3), np.inf),),
           C.Value(checks.NonFiniteError)),
    # reverse selection returns indices: the sentinel is -1 everywhere.
    C.Case("d2pruning.reverse_message_passing_select NaN score", (D2, "select"),
           lambda: (C.with_entry(D2()["scores"], 0, np.nan),), C.Value(checks.NonFiniteError, C.all_equal(-1))),
    C.Case("d2pruning.forward_message_passing inf score", (D2, "forward"),
           lambda: (C.with_entry(D2()["scores"], 0, np.inf),), C.Value(checks.NonFiniteError)),
    C.Case("fps.sample NaN measurement", (FPS, "sample"), lambda: (np.array([np.nan], C.F32), np.float32(0.3)),
           C.Value(checks.NonFiniteError)),
    C.Case("fps.resample all -inf log-weights", (FPS, "resample"), lambda: (np.full((3,), -np.inf, C.F32),),
           C.Value(checks.NonFiniteError, C.all_equal(-1))),
    # -inf log-probabilities: hidden entries (masked / top-k), read as the official top-k fill -30.
    C.Case("lm_inversion.unroll -inf (masked)", (LI, "unroll"),
           lambda: (C.with_entry(C.log_distributions(), (0, 3), -np.inf),),
           C.Accepted(lambda out: float(out[0, 0, 3]) == -30.0)),
]


@pytest.mark.parametrize("case,mode", C.params(CASES))
def test_nonfinite(case, mode):
  C.check_case(case, mode)


def test_nan_rewards_propagate_as_documented():
  # A NaN reward is the input's own NaN: q_target documents that the target of that row is NaN, the rest finite.
  out = np.asarray(LDCQ()["target"](*C.ldcq_args(r=C.with_entry(LDCQ()["data"]["r"], 0, np.nan))))
  assert np.isnan(out[:, 0]).all() and np.isfinite(out[:, 1:]).all()


def test_inverter_trains_on_masked_distributions():
  # One -inf log-probability (a top-k distribution) gave a NaN loss: the train step now stays finite.
  import jax
  import optax
  from iclr24_jax.common.train_state import TrainState
  from iclr24_jax.lm import t5
  li = LI()["li"]
  cfg = t5.T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_heads=2, num_layers=1, num_decoder_layers=1)
  inv = li.Inverter(cfg, width=4, num_chunks=li.num_chunks(10, 4), bottleneck=8)
  state = TrainState.create(jax.jit(lambda k: li.init_params(k, inv))(jax.random.key(0)), optax.adam(1e-3),
                            extra={"unigram": np.zeros((10,), C.F32)})
  lp = C.with_entry(C.log_distributions(), (0, 3), -np.inf)
  batch = {"logprobs": lp, "labels": np.array([[3, 4, 1], [5, 1, 0]], np.int32),
           "label_mask": np.array([[1, 1, 1], [1, 1, 0]], bool)}
  state, metrics = jax.jit(li.make_train_step(inv))(state, batch, jax.random.key(0))
  assert np.isfinite(float(metrics["loss"])) and np.isfinite(np.asarray(state.extra["unigram"])).all()
