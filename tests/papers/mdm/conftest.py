"""Fixtures shared by the MDM test modules: the 2-level NestedUNet and its params (one per session: ~2 s
to build, used by the model, train and programs tests)."""
import jax
import pytest

from iclr24_jax.diffusion import schedules
from iclr24_jax.papers import mdm
from .helpers import OUTER, INNER, _fast_jit


@pytest.fixture(scope="session")
def nested():
  """A class-conditional 2-level NestedUNet (16 -> 8), its level schedules and initial params."""
  model = mdm.make_model([OUTER, INNER], num_classes=10)
  scheds = mdm.level_schedules(schedules.squaredcos_cap_v2(100), 2, 2, power=1.0)
  params = _fast_jit(lambda k: mdm.init_params(k, model, (16, 16, 1)), jax.random.key(0))(jax.random.key(0))
  return model, scheds, params
