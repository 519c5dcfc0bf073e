"""Shapes, ranks and static arguments are structure: a named error at trace time in every mode (never a
broadcast to a wrong shape), and per-row math takes leading batch dims ([..., V]) so jax.vmap composes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.common import checks
from tests.contracts import helpers as C

LDCQ, MOTIF, CPM, SG, LI, CDGM, FPS = C.ldcq, C.motif, C.cpm, C.safeguards, C.lm_inversion, C.cdgm, C.fps

CASES = [
    # ldcq.q_target with rewards [B, 1] returned [1, B, B] targets (a silent broadcast) or crashed in XLA.
    C.Case("ldcq.q_target rewards [B,1]", (LDCQ, "target"), lambda: C.ldcq_args(r=LDCQ()["data"]["r"][:, None]),
           C.Structural(checks.ShapeError)),
    C.Case("ldcq.q_target dones [B,1]", (LDCQ, "target"), lambda: C.ldcq_args(d=LDCQ()["data"]["d"][:, None]),
           C.Structural(checks.ShapeError)),
    C.Case("ldcq.q_target next_states [B]", (LDCQ, "target"), lambda: C.ldcq_args(s=LDCQ()["data"]["s"][:, 0]),
           C.Structural(checks.ShapeError)),
    # motif broadcast a length-1 label array over the batch; float message buffers read as empty strings.
    C.Case("motif.preference_loss length-1 labels", (MOTIF, "loss"),
           lambda: (MOTIF()["m1"], MOTIF()["m2"], np.array([1], np.int32)), C.Structural(checks.ShapeError)),
    C.Case("motif.preference_loss float messages", (MOTIF, "loss"),
           lambda: (MOTIF()["m1"] / np.float32(255), MOTIF()["m2"] / np.float32(255), np.array([0, 1, 2])),
           C.Structural(checks.DtypeError)),
    C.Case("cpm.fit labels [N,1]", (CPM, "fit"), lambda: (*C.cpm_data()[:2], C.cpm_data()[2][:, None]),
           C.Structural(checks.ShapeError)),
    C.Case("safeguards.propagate K mismatch", (SG, "propagate"), lambda: (SG()["p"][:, :2],),
           C.Structural(checks.ShapeError)),
    C.Case("fps.sample y of the wrong shape", (FPS, "sample"),
           lambda: (np.array([0.4, 0.1], C.F32), np.float32(0.3)), C.Structural(checks.ShapeError)),
    C.Case("cdgm.ConstraintLayer width 2 for 3 features", (CDGM, "call"), lambda: (CDGM()["x"][:, :2],),
           C.Structural(checks.ShapeError)),
    # accepted: per-row functions take one row (and any leading dims)
    C.Case("lm_inversion.unroll [V] row", (LI, "unroll"), lambda: (C.log_distributions()[0],),
           C.Accepted(lambda out: out.shape == (3, 4))),
    C.Case("safeguards.propagate [K] row", (SG, "propagate"), lambda: (SG()["p"][0],),
           C.Accepted(lambda out: out.shape == ())),
    C.Case("cdgm.ConstraintLayer [2, B, D]", (CDGM, "call"), lambda: (np.stack([CDGM()["x"]] * 2),),
           C.Accepted(lambda out: out.shape == (2, 2, 3))),
    C.Case("cdgm.ConstraintLayer as a jit argument", (CDGM, "as_argument"), lambda: (CDGM()["x"],),
           C.Accepted(lambda out: bool(np.all(np.asarray(C.cdgm()["cdgm"].satisfied(out, C.cdgm()["cons"])))))),
    C.Case("motif.preference_loss without model=", (MOTIF, "loss_inferred"),
           lambda: (MOTIF()["m1"], MOTIF()["m2"], np.array([0, 1, 2], np.int32)),
           C.Accepted(lambda out: np.allclose(out, MOTIF()["loss"](MOTIF()["m1"], MOTIF()["m2"],
                                                                   np.array([0, 1, 2], np.int32)), rtol=1e-5))),
]


@pytest.mark.parametrize("case,mode", C.params(CASES))
def test_shapes(case, mode):
  C.check_case(case, mode)


def test_rows_match_the_batch():
  # [V] rows unroll exactly like their row of the batch, so vmap over rows equals the batched call.
  li = LI()["li"]
  lp = C.log_distributions(3)
  batched = LI()["unroll"](lp)
  np.testing.assert_array_equal(jax.vmap(LI()["unroll"])(lp), batched)
  np.testing.assert_array_equal(LI()["unroll"](lp[1]), batched[1])
  # width given as a Python int under jit: static, compiled once per width
  f = jax.jit(li.unroll, static_argnames=("width",))
  np.testing.assert_array_equal(f(lp, jnp.zeros(10), width=4), batched)


def test_motif_model_mismatch_is_named():
  m = MOTIF()
  big = m["motif"].RewardModel(embed_dim=4, hidden=4, trunk=16)
  with pytest.raises(checks.ShapeError, match="trunk"):
    m["motif"].preference_loss(m["params"], {"message_1": m["m1"], "message_2": m["m2"],
                                             "label": np.array([0, 1, 2])}, big)


@pytest.mark.parametrize("mode", ["jit", "vmap", "checked"])
def test_traced_static_argument_is_named(mode):
  # unroll's width fixes the output shape: traced, it is a named StaticArgumentError (it was a
  # TracerBoolConversionError); eagerly a concrete NumPy int is accepted.
  case = C.Case("lm_inversion.unroll traced width", (LI, "unroll_width"),
                lambda: (C.log_distributions(), np.int32(4)), C.Structural(checks.StaticArgumentError))
  C.check_case(case, mode)
  assert LI()["unroll_width"](C.log_distributions(), np.int32(4)).shape == (2, 3, 4)
