"""MDM's programs (`papers/mdm/programs.py`, slow): an arm's host loop equals the fori_loop program."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from iclr24_jax.common.train_state import TrainState


@pytest.mark.slow   # ~70 s: compiles the step twice (host loop and fori_loop)
def test_arm_host_loop_equals_the_fori_loop(nested):
  """Arm.train on CPU (a host loop of one jitted step) runs the same steps, batches and keys as the fori_loop
  program used on accelerators."""
  from iclr24_jax.papers.mdm.programs import Arm
  model, scheds, params = nested
  rng = np.random.default_rng(3)
  arrays = {"x": jnp.asarray(rng.uniform(-1, 1, (32, 16, 16, 1)), jnp.float32), "y": jnp.arange(32) % 10}
  eval_kw = (arrays["x"][:4], arrays["y"][:4], jnp.arange(2))
  arm = Arm(model, scheds, (16, 16, 1), 4, optax.adam(1e-3), {}, dict(num_steps=2), eval_kw)
  out = {}
  for host in (True, False):
    arm._host_loop = host
    state = TrainState.create(jax.tree.map(jnp.copy, params), optax.adam(1e-3))
    state, loss = arm.train(state, jax.random.key(4), arrays, 3)
    out[host] = (state.params, float(loss), int(state.step))
  chex.assert_trees_all_close(out[True][0], out[False][0], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out[True][1], out[False][1], rtol=1e-5)
  assert out[True][2] == out[False][2] == 3
