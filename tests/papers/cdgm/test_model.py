"""C-DGM models (`papers/cdgm/model.py`): the CTGAN conditional loss by hand, a train step lowers the loss, clear
errors, constrained models never violate."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from iclr24_jax.papers import cdgm
from iclr24_jax.papers.cdgm import data as data_lib
from iclr24_jax.papers.cdgm import model as model_lib
from iclr24_jax.papers.cdgm import transform as tfm
from iclr24_jax.papers.cdgm import train as train_lib
from .helpers import _adam, _manual_transform


def test_ctgan_conditional_loss_by_hand():
  tf = _manual_transform()
  m = model_lib.CTGAN(tf, None, "unconstrained", __import__("optax").adam(1e-3), __import__("optax").adam(1e-3),
                      batch_size=10)
  # category logits [0, ln 3] with target class 1: CE = -log(3 / 4) = 0.28768; mask 1; one row -> 0.28768.
  raw = jnp.array([[0.0, 0.0, 0.0, 0.0, np.log(3.0)]])
  ce = m._cond_loss(raw, jnp.array([[0.0, 1.0]]), jnp.array([[1.0]]))
  np.testing.assert_allclose(ce, -np.log(0.75), atol=1e-6)


@pytest.mark.parametrize("kind", ["tvae", pytest.param("ctgan", marks=pytest.mark.slow)])
def test_train_step_lowers_loss_on_a_fixed_batch(generated_setup, kind):
  table, tf, enc, layer = generated_setup
  if kind == "tvae":
    m = model_lib.TVAE(tf, layer, "constrained", _adam(3e-3), embedding_dim=8, compress_dims=(32,),
                       decompress_dims=(32,), batch_size=50)
    data = {"x": jnp.asarray(enc)}
  else:
    m = model_lib.CTGAN(tf, layer, "constrained", _adam(1e-3), _adam(1e-3), embedding_dim=8, generator_dim=(32,),
                        discriminator_dim=(32,), pac=10, batch_size=50)
    data = model_lib.conditional_data(tf, enc)
  state = jax.jit(m.init)(jax.random.key(0))
  batch = jax.jit(m.make_batch)(data, jax.random.key(1))
  key = jax.random.key(2)
  chex.clear_trace_counter()

  @jax.jit
  @chex.assert_max_traces(n=1)
  def step(state):
    return m.train_step(state, batch, key)

  if kind == "tvae":
    loss = jax.jit(lambda s: m.loss_fn(s.params, batch, jax.random.fold_in(key, 0))[0])
  else:  # the generator's loss against the initial critic, on the fixed batch
    d0 = state.d_params
    loss = jax.jit(lambda s: m.g_loss_fn(s.g_params, d0, s.batch_stats, batch, key)[0])
  first = float(loss(state))
  for _ in range(15):
    state, metrics = step(state)
  assert "loss" in metrics
  assert float(loss(state)) < first


def test_model_errors(generated_setup):
  table, tf, enc, layer = generated_setup
  with pytest.raises(ValueError, match="needs a ConstraintLayer"):
    model_lib.TVAE(tf, None, "constrained", _adam(1e-3))
  with pytest.raises(ValueError, match="unknown version"):
    model_lib.TVAE(tf, layer, "bogus", _adam(1e-3))
  with pytest.raises(ValueError, match="multiple of pac"):
    model_lib.CTGAN(tf, None, "unconstrained", _adam(1e-3), _adam(1e-3), batch_size=55)
  bad = cdgm.ConstraintLayer(cdgm.parse_constraints("y_6 >= 0"), 7)
  with pytest.raises(ValueError, match="discrete columns"):
    model_lib.TVAE(tf, bad, "constrained", _adam(1e-3))
  with pytest.raises(ValueError, match="NaN"):
    tfm.fit_transform(np.array([[1.0, np.nan]]))


def _constrained_samples(table, kind, version="constrained", steps=0):
  """(network-only rows, the model's own samples) of a small model, after `steps` training steps."""
  tf = tfm.fit_transform(table.train, table.discrete, max_fit_rows=300, max_iter=20)
  enc = tfm.encode(tf, table.train)
  layer = cdgm.ConstraintLayer(table.constraints, table.num_features)
  if kind == "tvae":
    m = model_lib.TVAE(tf, layer, version, _adam(1e-3), embedding_dim=8, compress_dims=(32,), decompress_dims=(32,),
                       batch_size=100)
    data = {"x": jnp.asarray(enc)}
  else:
    m = model_lib.CTGAN(tf, layer, version, _adam(1e-3), _adam(1e-3), embedding_dim=8, generator_dim=(32,),
                        discriminator_dim=(32,), batch_size=100)
    data = model_lib.conditional_data(tf, enc)
  if steps:
    state = train_lib.fit(m, data, steps, jax.random.key(0), log_every=steps).state
  else:
    state = jax.jit(m.init)(jax.random.key(0))
  kw = {} if kind == "tvae" else {"cond_prob": data["cond_prob"]}
  arg = state.params if kind == "tvae" else state
  both = jax.jit(lambda a, k: (m.sample(a, k, 2000, apply_layer=False, **kw), m.sample(a, k, 2000, **kw)))
  raw, rows = both(arg, jax.random.key(1))
  return np.asarray(raw), np.asarray(rows)


@pytest.mark.parametrize("name,kind", [("heloc", "tvae"), ("faults", "ctgan")])
def test_constrained_models_never_violate_on_real_tables(shared_data, name, kind):
  table = data_lib.load_table(name)
  raw, rows = _constrained_samples(table, kind)
  assert np.all(np.isfinite(rows))
  assert float(cdgm.violation_rate(raw, table.constraints)) > 0.0   # the network alone does violate
  assert float(cdgm.violation_rate(rows, table.constraints)) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("name,kind,version", [
    ("heloc", "tvae", "constrained"), ("heloc", "ctgan", "constrained"), ("faults", "tvae", "constrained"),
    ("faults", "ctgan", "constrained"), ("heloc", "tvae", "postprocessing"), ("faults", "ctgan", "postprocessing")])
def test_trained_constrained_models_never_violate(shared_data, name, kind, version):
  table = data_lib.load_table(name)
  _, rows = _constrained_samples(table, kind, version, steps=30)
  assert float(cdgm.violation_rate(rows, table.constraints)) == 0.0
