"""DA-CLIP's training helpers (`papers/daclip/train.py`): the host-loop chunk runner equals the scan,
the linear probe picks its regularisation on training folds only."""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from iclr24_jax.common.train_state import TrainState


def test_chunk_runner_host_loop_equals_scan():
  """The CPU host loop and the accelerator lax.scan run the same steps with the same keys (a conv step)."""
  import flax.linen as nn
  import optax
  from iclr24_jax.papers.daclip import train as train_lib

  net = nn.Conv(4, (3, 3))
  tx = optax.adam(1e-2)
  x_all = jax.random.normal(jax.random.key(0), (32, 8, 8, 2))
  params = net.init(jax.random.key(1), x_all[:1])["params"]
  state0 = TrainState.create(params, tx)

  def step(state, batch, key):
    def loss(p):
      out = net.apply({"params": p}, batch)
      return jnp.mean((out - jax.random.normal(key, out.shape)) ** 2)
    val, g = jax.value_and_grad(loss)(state.params)
    return state.apply_gradients(g), {"loss": val}

  def sample(d, k):
    return d["x"][jax.random.randint(k, (4,), 0, d["x"].shape[0])]

  key = jax.random.key(2)
  data = {"x": x_all}
  out = {}
  for scan in (True, False):
    run = train_lib.chunk_runner(step, sample, key, scan=scan)
    st, m1 = run(state0, data, 0, 3)
    st, m2 = run(st, data, 3, 2)
    out[scan] = (st.params, m1["loss"], m2["loss"], int(st.step))
  chex.assert_trees_all_close(out[True][0], out[False][0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose([out[True][1], out[True][2]], [out[False][1], out[False][2]], rtol=1e-5)
  assert out[True][3] == out[False][3] == 5


def test_linear_probe_picks_its_regularisation_on_training_folds_only():
  """Separable classes: the probe is perfect; labels unrelated to the features: it is near chance (1/3), not
  silently perfect (the test labels never reach the fit), and its CV accuracy says so too."""
  from iclr24_jax.papers.daclip import train as train_lib
  rng = np.random.default_rng(0)
  centres = 5.0 * np.eye(3, 8)
  y_tr, y_te = rng.integers(0, 3, 150), rng.integers(0, 3, 90)
  x_tr = centres[y_tr] + rng.normal(size=(150, 8)) + 10.0      # offset: the unit-normalisation keeps directions
  x_te = centres[y_te] + rng.normal(size=(90, 8)) + 10.0
  correct, info = train_lib.linear_probe(x_tr, y_tr, x_te, y_te)
  chex.assert_shape(correct, (90,))
  assert correct.mean() > 0.95 and info["cv_accuracy"] > 0.95
  assert info["C"] in train_lib.PROBE_CS
  noise_tr, noise_te = rng.normal(size=(150, 8)), rng.normal(size=(300, 8))
  correct, info = train_lib.linear_probe(noise_tr, y_tr, noise_te, rng.integers(0, 3, 300))
  assert abs(correct.mean() - 1 / 3) < 0.12 and info["cv_accuracy"] < 0.5
