"""Tests for cdgm: parsing, Fourier-Motzkin reduction, the Constraint Layer, the models and the experiment."""
from fractions import Fraction

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iclr24_jax.papers import cdgm
from iclr24_jax.papers.cdgm import data as data_lib
from iclr24_jax.papers.cdgm import model as model_lib
from iclr24_jax.papers.cdgm import transform as tfm
from iclr24_jax.papers.cdgm import train as train_lib

# --------------------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------------------

OFFICIAL_COUNTS = {"url": (8, 39), "wids": (31, 109), "lcld": (4, 28), "news": (5, 59), "botnet": (362, 757),
                   "heloc": (7, 23), "faults": (4, 27)}


def test_parse_official_syntax():
  c = cdgm.parse_constraints("ordering y_1 y_0 y_2\n"
                             "y_0 - 3y_2 - y_1 >= 0\n"
                             "y_1 - y_0 > 0\n"
                             "- y_1 >= -60\n")
  assert c.ordering == (1, 0, 2)
  np.testing.assert_array_equal(c.coefficients, [[1, -1, -3], [-1, 1, 0], [0, -1, 0]])
  np.testing.assert_array_equal(c.constants, [0, 0, -60])
  np.testing.assert_array_equal(c.strict, [False, True, False])
  assert c.num_constraints == 3 and c.num_variables == 3


def test_parse_extensions_constants_both_sides_and_le():
  # y_0 + 2 >= 3*y_1 - 1.5  ->  y_0 - 3 y_1 >= -3.5 ;  0.5y_2 <= y_0  ->  y_0 - 0.5 y_2 >= 0 ;  y_1 = 4 -> two rows
  c = cdgm.parse_constraints("y_0 + 2 >= 3*y_1 - 1.5\n0.5y_2 <= y_0   # comment\n\ny_1 = 4\n")
  assert c.ordering == (0, 1, 2)  # no ordering line: variables by index
  np.testing.assert_allclose(c.coefficients, [[1, -3, 0], [1, 0, -0.5], [0, 1, 0], [0, -1, 0]])
  np.testing.assert_allclose(c.constants, [-3.5, 0, 4, -4])
  assert not c.strict.any()
  assert c.rows[0].coef(1) == Fraction(-3)


def test_parse_errors_are_clear():
  with pytest.raises(ValueError, match="exactly one of"):
    cdgm.parse_constraints("y_0 y_1")
  with pytest.raises(ValueError, match="ordering does not include"):
    cdgm.parse_constraints("ordering y_0\ny_1 - y_0 >= 0")
  with pytest.raises(ValueError, match="not supported"):
    cdgm.parse_constraints("y_0 >= 0 or y_1 >= 0")
  with pytest.raises(ValueError, match="cannot parse"):
    cdgm.parse_constraints("y_0 - x_1 >= 0")
  with pytest.raises(cdgm.InfeasibleConstraintsError, match="0 >= 1"):
    cdgm.parse_constraints("y_0 - y_0 >= 1")


def test_every_official_constraint_file_parses_and_is_enforced(shared_data):
  rng = np.random.default_rng(0)
  for name, (n_cons, n_vars) in OFFICIAL_COUNTS.items():
    c = data_lib.load_named_constraints(name)
    assert (c.num_constraints, c.num_variables) == (n_cons, n_vars), name
    layer = cdgm.ConstraintLayer(c, n_vars)
    x = rng.normal(0, 10, (64, n_vars)).astype(np.float32)
    y = jax.jit(layer)(x)
    assert float(cdgm.violation_rate(x, c)) > 0, name
    assert bool(cdgm.satisfied(y, c).all()), name


def test_botnet_reduction_sizes(shared_data):
  # 362 constraints over 468 of 757 variables; along the file's ordering FM makes 110 combinations, 108 of
  # them duplicates of existing rows; the layer uses 362 rows (one per constraint at its last variable).
  c = data_lib.load_named_constraints("botnet")
  r = cdgm.reduce_constraints(c)
  assert r.stats["combinations"] == 110
  assert r.stats["pruned_duplicates"] == 108
  assert r.stats["active_rows"] == 362
  plain = cdgm.reduce_constraints(c, prune=False)
  assert plain.stats["active_rows"] >= r.stats["active_rows"]


# --------------------------------------------------------------------------------------------------------------
# Hand-worked reductions and corrections
# --------------------------------------------------------------------------------------------------------------

CHAIN = """ordering y_0 y_1 y_2
y_1 - y_0 >= 0
y_2 - y_1 >= 0
- y_2 >= -10
"""

# Reduction of CHAIN (last variable eliminated first):
#   set(y_2) = {c1: y_1 - y_0 >= 0, c2: -y_1 + y_2 >= 0, c3: -y_2 >= -10}
#   eliminate y_2: c2 (+y_2) + c3 (-y_2) = -y_1 >= -10          -> set(y_1) = {c1, -y_1 >= -10}
#   eliminate y_1: c1 (+y_1) + (-y_1 >= -10) = -y_0 >= -10      -> set(y_0) = {-y_0 >= -10}
# Correction of x = [12, 3, 20]: y_0 <= 10 -> 10; y_1 in [y_0, 10] = [10, 10] -> 10; y_2 in [y_1, 10] -> 10.
# Correction of x = [1, 0, 5]:   y_0 = 1; y_1 in [1, 10] -> 1; y_2 in [1, 10] -> 5.


def _norm(row):
  """(coefficients / |first|, constant / |first|) for comparing rows up to positive scaling."""
  items = sorted(row.coeffs)
  s = abs(items[0][1])
  return tuple((v, a / s) for v, a in items), row.constant / s, row.strict


def test_chain_reduction_by_hand():
  c = cdgm.parse_constraints(CHAIN)
  r = cdgm.reduce_constraints(c)
  assert [len(s) for s in r.sets] == [1, 2, 3]
  assert _norm(r.rows_for(0)[0]) == (((0, Fraction(-1)),), Fraction(-10), False)
  assert sorted(_norm(x) for x in r.rows_for(1)) == sorted([
      (((0, Fraction(-1)), (1, Fraction(1))), Fraction(0), False),
      (((1, Fraction(-1)),), Fraction(-10), False)])


@pytest.mark.parametrize("schedule", ["levels", "sequential", "scan"])
def test_chain_correction_by_hand(schedule):
  layer = cdgm.ConstraintLayer(cdgm.parse_constraints(CHAIN), 3, schedule=schedule)
  y = jax.jit(layer)(jnp.array([[12.0, 3.0, 20.0], [1.0, 0.0, 5.0]]))
  np.testing.assert_allclose(y, [[10, 10, 10], [1, 1, 5]], rtol=1e-6)


FOUR = """ordering y_0 y_1 y_2 y_3
y_3 - 2y_1 >= 0
- y_3 + y_2 >= -4
y_1 + y_0 > 1
- y_2 >= -3
"""

# Reduction of FOUR:
#   eliminate y_3: c1 (y_3 >= 2 y_1) + c2 (y_3 <= y_2 + 4) -> d1: -2 y_1 + y_2 >= -4      set(y_2) = {c3, c4, d1}
#   eliminate y_2: d1 (+y_2) + c4 (-y_2 >= -3)               -> d2: -2 y_1 >= -7  (y_1 <= 3.5)   set(y_1) = {c3, d2}
#   eliminate y_1: 2*c3 (2 y_1 + 2 y_0 > 2) + d2             -> d3: 2 y_0 > -5    (y_0 > -2.5)   set(y_0) = {d3}
# Correction of x = [-5, 10, 9, 0] with epsilon = 0.25:
#   y_0: lower -2.5 + 0.25 = -2.25                              -> -2.25
#   y_1: lower (c3) 1 - y_0 + 0.25 = 3.5, upper (d2) 3.5          -> 3.5
#   y_2: lower (d1) 2 y_1 - 4 = 3, upper (c4) 3                    -> 3
#   y_3: lower (c1) 2 y_1 = 7, upper (c2) y_2 + 4 = 7              -> 7
# and c3 holds strictly: 3.5 - 2.25 = 1.25 > 1.


def test_four_variable_reduction_by_hand():
  r = cdgm.reduce_constraints(cdgm.parse_constraints(FOUR))
  assert [len(s) for s in r.sets] == [1, 2, 3, 4]
  (d3,) = r.rows_for(0)
  assert _norm(d3) == (((0, Fraction(1)),), Fraction(-5, 2), True)
  assert sorted(_norm(x) for x in r.rows_for(2)) == sorted([
      (((1, Fraction(-1)), (2, Fraction(1, 2))), Fraction(-2), False),  # d1 / |-2|: -y_1 + y_2 / 2 >= -2
      (((2, Fraction(-1)),), Fraction(-3), False)])                       # c4
  assert r.stats["combinations"] == 3


def test_four_variable_correction_by_hand():
  c = cdgm.parse_constraints(FOUR)
  layer = cdgm.ConstraintLayer(c, 4, epsilon=0.25)
  x = jnp.array([[-5.0, 10.0, 9.0, 0.0]])
  y = jax.jit(layer)(x)
  np.testing.assert_allclose(y, [[-2.25, 3.5, 3.0, 7.0]], rtol=1e-6)
  assert bool(cdgm.satisfied(y, c, tol=0.0).all())   # exact check, strict inequality included
  assert layer.num_levels == 4                        # a chain: every variable reads the previous one


def test_infeasible_sets_name_the_conflict():
  with pytest.raises(cdgm.InfeasibleConstraintsError, match=r"y_0 >= 2.*- y_0 >= -1"):
    cdgm.ConstraintLayer(cdgm.parse_constraints("y_0 >= 2\n- y_0 >= -1\ny_1 >= 0"), 2)
  # A strict cycle: y_1 > y_0, y_2 > y_1, y_0 >= y_2 gives 0 > 0.
  with pytest.raises(cdgm.InfeasibleConstraintsError, match=r"#0.*#1.*#2"):
    cdgm.ConstraintLayer(cdgm.parse_constraints("y_1 - y_0 > 0\ny_2 - y_1 > 0\ny_0 - y_2 >= 0"), 3)


def test_layer_input_errors():
  layer = cdgm.ConstraintLayer(cdgm.parse_constraints(CHAIN), 3)
  with pytest.raises(ValueError, match="num_features=3"):
    layer(jnp.zeros((2, 4)))
  # any leading batch dims (vmap over batches composes), and the layer is a pytree argument of jitted code
  x = jnp.arange(12.0).reshape(2, 2, 3) - 6.0
  np.testing.assert_array_equal(layer(x), layer(x.reshape(4, 3)).reshape(2, 2, 3))
  np.testing.assert_array_equal(jax.jit(lambda l, v: l(v))(layer, x[0]), layer(x[0]))
  with pytest.raises(ValueError, match="does not exist"):
    cdgm.ConstraintLayer(cdgm.parse_constraints(CHAIN), 2)
  with pytest.raises(ValueError, match="unknown schedule"):
    cdgm.ConstraintLayer(cdgm.parse_constraints(CHAIN), 3, schedule="bogus")


def test_layer_shapes_gradient_and_passthrough():
  c = data_lib.load_generated().constraints
  layer = cdgm.ConstraintLayer(c, 7)
  x = jnp.asarray(np.random.default_rng(1).normal(0, 20, (32, 7)), jnp.float32)
  y = jax.jit(layer)(x)
  chex.assert_shape(y, (32, 7))
  chex.assert_type(y, jnp.float32)
  np.testing.assert_array_equal(y[:, 6], x[:, 6])                      # y_6 is unconstrained
  np.testing.assert_array_equal(jax.jit(layer)(x[0]), y[0])             # [D] inputs
  g = jax.jit(jax.grad(lambda z: jnp.sum(layer(z) ** 2)))(x)
  assert bool(jnp.all(jnp.isfinite(g)))
  # The unconstrained column passes through: d y_6 / d x_6 = 1 and nothing else reads it.
  gy = jax.jit(jax.grad(lambda z: jnp.sum(layer(z)[:, 6])))(x)
  np.testing.assert_array_equal(gy[:, 6], np.ones(32))
  np.testing.assert_array_equal(gy[:, :6], np.zeros((32, 6)))


def test_schedules_and_devices_agree(shared_data):
  from iclr24_jax.common import sharding
  c = data_lib.load_named_constraints("url")
  x = np.random.default_rng(2).normal(0, 10, (64, 39)).astype(np.float32)
  outs = [np.asarray(jax.jit(cdgm.ConstraintLayer(c, 39, schedule=s))(x)) for s in ("levels", "sequential", "scan")]
  np.testing.assert_array_equal(outs[0], outs[1])
  np.testing.assert_array_equal(outs[0], outs[2])
  mesh = sharding.make_mesh()
  layer = cdgm.ConstraintLayer(c, 39)
  y8 = jax.jit(layer, in_shardings=sharding.data_sharding(mesh))(jax.device_put(x, sharding.data_sharding(mesh)))
  np.testing.assert_array_equal(np.asarray(y8), outs[0])


# --------------------------------------------------------------------------------------------------------------
# Property test: random feasible systems
# --------------------------------------------------------------------------------------------------------------


@st.composite
def feasible_systems(draw):
  """A random system over 5 variables (each constraint uses a random subset) built around a witness point x*
  (so it is feasible), every constraint holding at x* with slack >= 0.5, and a random ordering."""
  d = 5
  n = draw(st.integers(1, 7))
  witness = np.array(draw(st.lists(st.integers(-5, 5), min_size=d, max_size=d)), np.float64)
  lines = []
  for _ in range(n):
    coefs = draw(st.lists(st.integers(-3, 3), min_size=d, max_size=d))
    if not any(coefs):
      coefs[draw(st.integers(0, d - 1))] = 1
    slack = draw(st.sampled_from([0.5, 1.0, 2.5]))
    strict = draw(st.booleans())
    b = float(np.dot(coefs, witness)) - slack
    terms = " ".join(f"{'+' if a > 0 else '-'} {abs(a)}y_{j}" for j, a in enumerate(coefs) if a)
    lines.append(f"{terms} {'>' if strict else '>='} {b}")
  order = draw(st.permutations(list(range(d))))
  text = "ordering " + " ".join(f"y_{o}" for o in order) + "\n" + "\n".join(lines)
  return text, d, witness


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(system=feasible_systems(), seed=st.integers(0, 2 ** 16))
def test_property_random_feasible_systems(system, seed):
  text, d, witness = system
  c = cdgm.parse_constraints(text)
  layer = jax.jit(cdgm.ConstraintLayer(c, d, epsilon=1e-3))
  rng = np.random.default_rng(seed)
  x = rng.normal(0, 8, (24, d)).astype(np.float32)
  # Already-satisfying rows (the witness plus noise of at most 0.01 keeps every slack > 0.4) in the last 8 rows.
  x[16:] = witness[None] + rng.uniform(-0.01, 0.01, (8, d))
  assert bool(cdgm.satisfied(x[16:], c, tol=0.0).all())
  y = np.asarray(layer(x))
  assert bool(cdgm.satisfied(y, c).all()), text
  np.testing.assert_array_equal(y[16:], x[16:])


# --------------------------------------------------------------------------------------------------------------
# Orderings
# --------------------------------------------------------------------------------------------------------------


def test_correlation_ordering_ranks_the_worst_feature_last():
  rng = np.random.default_rng(0)
  z = rng.normal(size=(2000, 1))
  real = np.concatenate([z, z + 0.1 * rng.normal(size=(2000, 1)), rng.normal(size=(2000, 1))], 1)
  fake = real.copy()
  fake[:, 1] = rng.normal(size=2000)   # breaks corr(0, 1) and corr(1, 2): feature 1 has the largest score
  scores = cdgm.correlation_scores(real, fake)
  assert int(np.argmax(scores)) == 1
  c = cdgm.correlation_ordering(cdgm.parse_constraints("y_1 - y_0 >= 0"), real, fake)
  assert c.ordering[-1] == 1 and sorted(c.ordering) == [0, 1, 2]
  r = cdgm.random_ordering(cdgm.parse_constraints("ordering y_0 y_1 y_2\ny_1 - y_0 >= 0"), seed=3)
  assert sorted(r.ordering) == [0, 1, 2]


# --------------------------------------------------------------------------------------------------------------
# Transform and models
# --------------------------------------------------------------------------------------------------------------


def _manual_transform():
  # One continuous column with components (mean 3, std 0.5) and (mean -2, std 1); one discrete column {0, 1}.
  return tfm.TableTransform(num_features=2, cont_idx=np.array([0], np.int32), disc_idx=np.array([1], np.int32),
                            means=np.array([[3.0, -2.0]]), stds=np.array([[0.5, 1.0]]),
                            comp_valid=np.array([[True, True]]), weights=np.array([[0.5, 0.5]]),
                            mins=np.array([-10.0]), maxs=np.array([10.0]), cat_values=np.array([[0.0, 1.0]]),
                            cat_valid=np.array([[True, True]]), cat_freq=np.array([[0.5, 0.5]]))


def test_transform_by_hand():
  tf = _manual_transform()
  assert tf.data_dim == 1 + 2 + 2
  # x = 4 in component 0: alpha = (4 - 3) / (4 * 0.5) = 0.5; decode: 0.5 * 4 * 0.5 + 3 = 4.
  # x = 5 in component 0: alpha = (5 - 3) / 2 = 1 -> clipped to 0.99; decode: 0.99 * 2 + 3 = 4.98.
  comp = jnp.array([[[1.0, 0.0]], [[1.0, 0.0]]])
  alpha = tfm.reencode_alpha(tf, jnp.array([[4.0, 0.0], [5.0, 1.0]]), comp)
  np.testing.assert_allclose(alpha, [[0.5], [0.99]], rtol=1e-6)
  v = tf.join(alpha, comp, jnp.array([[[1.0, 0.0]], [[0.0, 1.0]]]))
  np.testing.assert_allclose(tfm.decode(tf, v), [[4.0, 0.0], [4.98, 1.0]], rtol=1e-6)
  enc = tfm.encode(tf, np.array([[4.0, 1.0], [-2.5, 0.0]]))
  chex.assert_shape(enc, (2, 5))
  np.testing.assert_allclose(tfm.decode(tf, jnp.asarray(enc)), [[4.0, 1.0], [-2.5, 0.0]], rtol=1e-5)


def test_ctgan_conditional_loss_by_hand():
  tf = _manual_transform()
  m = model_lib.CTGAN(tf, None, "unconstrained", __import__("optax").adam(1e-3), __import__("optax").adam(1e-3),
                      batch_size=10)
  # category logits [0, ln 3] with target class 1: CE = -log(3 / 4) = 0.28768; mask 1; one row -> 0.28768.
  raw = jnp.array([[0.0, 0.0, 0.0, 0.0, np.log(3.0)]])
  ce = m._cond_loss(raw, jnp.array([[0.0, 1.0]]), jnp.array([[1.0]]))
  np.testing.assert_allclose(ce, -np.log(0.75), atol=1e-6)


@pytest.fixture(scope="module")
def generated_setup():
  table = data_lib.load_generated(n_train=600, n_val=50, n_test=200)
  tf = tfm.fit_transform(table.train, table.discrete, max_fit_rows=300, max_iter=20)
  enc = tfm.encode(tf, table.train)
  layer = cdgm.ConstraintLayer(table.constraints, table.num_features)
  return table, tf, enc, layer


def _adam(lr):
  import optax
  return optax.adam(lr)


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


def test_fit_seeds_matches_one_fit_per_seed(generated_setup):
  table, tf, enc, layer = generated_setup
  # Unconstrained: the seed axis is what is tested, and the layer-free step compiles in a fraction of the time.
  m = model_lib.TVAE(tf, None, "unconstrained", _adam(1e-3), embedding_dim=8, compress_dims=(16,),
                     decompress_dims=(16,), batch_size=50)
  data = {"x": jnp.asarray(enc)}
  keys = jax.vmap(jax.random.key)(jnp.arange(3))
  many = train_lib.fit_seeds(m, data, 12, keys, log_every=6)          # two chunks of 6: one compilation
  assert jax.tree.leaves(many.state.params)[0].shape[0] == 3
  assert [r["step"] for r in many.history] == [6, 12] and len(many.history[0]["train/loss"]) == 3
  one = train_lib.fit(m, data, 12, jax.random.key(2), log_every=6).state
  chex.assert_trees_all_close(jax.tree.map(lambda x: x[2], many.state.params), one.params, rtol=1e-4, atol=1e-5)
  other = jax.tree.map(lambda x: x[0], many.state.params)              # another seed: really another run
  assert not np.allclose(np.asarray(other["sigma"]), np.asarray(one.params["sigma"])) or not np.allclose(
      np.asarray(jax.tree.leaves(other)[0]), np.asarray(jax.tree.leaves(one.params)[0]))
  with pytest.raises(ValueError, match=r"\[S\] array of keys"):
    train_lib.fit_seeds(m, data, 2, jax.random.key(0))


def test_on_boundary_by_hand():
  cons = cdgm.parse_constraints("y_0 >= y_1\ny_1 >= 0")
  x = np.array([[2.0, 1.0],    # slack 1 and 1: inside
                [1.0, 1.0],    # y_0 - y_1 = 0: on the first boundary
                [3.0, 0.0],    # y_1 = 0: on the second
                [0.5, 1.0]])   # violates, on no boundary
  np.testing.assert_array_equal(np.asarray(cdgm.on_boundary(jnp.asarray(x), cons)), [False, True, True, False])
  # The layer's output lands on a boundary exactly where it corrected a row.
  layer = cdgm.ConstraintLayer(cons, 2)
  y = np.asarray(layer(jnp.asarray(x, jnp.float32)))
  assert bool(cdgm.on_boundary(jnp.asarray(y[3:]), cons)[0])


def test_detection_groups_split_the_held_out_synthetic_rows():
  from iclr24_jax.papers.cdgm import evaluation
  rng = np.random.default_rng(0)
  real = rng.normal(0, 1, (400, 3))
  # the first half of the synthetic rows is far from the real ones (always detected), the second half is real-like
  synth = np.concatenate([rng.normal(8, 1, (200, 3)), rng.normal(0, 1, (200, 3))])
  far = np.arange(400) < 200
  out = evaluation.detection(real, synth, seed=0, groups={"far": far, "near": ~far})
  assert out["count_far"] + out["count_near"] == 120      # 30% of 400 synthetic rows held out
  assert out["detected_far"] == 1.0 and out["detected_near"] < 0.8
  with pytest.raises(ValueError, match="one per synthetic row"):
    evaluation.detection(real, synth, groups={"bad": far[:10]})


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


# --------------------------------------------------------------------------------------------------------------
# Data, config and the experiment
# --------------------------------------------------------------------------------------------------------------


def test_generated_table_satisfies_its_constraints():
  t = data_lib.load_generated()
  for split in (t.train, t.val, t.test):
    assert float(cdgm.violation_rate(split, t.constraints)) == 0.0
  # The reduction of the embedded constraints combines y_2's bounds into y_3 + y_4 - 2 y_1 <= 10.
  r = cdgm.reduce_constraints(t.constraints)
  assert r.stats["combinations"] >= 1


def test_shared_tables_load(shared_data):
  h = data_lib.load_heloc()
  assert h.train.shape == (7530, 24) and h.test.shape == (2092, 24) and h.label == 23
  f = data_lib.load_faults()
  assert f.num_features == 28 and f.num_classes == 7
  assert len(f.train) + len(f.val) + len(f.test) == 1941
  with pytest.raises(FileNotFoundError, match="does not exist"):
    data_lib.load_heloc("/nonexistent/cdgm")


def test_config_variants():
  from iclr24_jax.configs import cdgm as cfg
  assert cfg.get_config().data.name == "generated"
  assert cfg.get_config("heloc").data.name == "heloc"
  o = cfg.get_config("heloc_official")
  assert (o.data.name, o.model.name, o.num_steps, o.model.loss_factor, o.optimizer.tvae.weight_decay) == (
      "heloc", "tvae", 2250, 2.0, 5e-6)
  c = cfg.get_config("faults_ctgan_postprocessing")
  assert (c.data.name, c.model.name, c.model.version) == ("faults", "ctgan", "postprocessing")
  with pytest.raises(ValueError, match="unknown variant"):
    cfg.get_config("nope")


def test_experiment_run_tiny(tmp_path):
  import json
  import os
  from iclr24_jax.configs import cdgm as cfg
  from iclr24_jax.papers.cdgm import experiment
  res = experiment.run(cfg.get_config("tiny"), str(tmp_path))
  assert res["violation_rate"] == 0.0
  for f in ("metrics.jsonl", "results.json", "loss.png", "constraint_pair.png"):
    assert os.path.exists(tmp_path / f), f
  with open(tmp_path / "results.json") as fh:
    assert json.load(fh)["data"] == "generated"
