"""C-DGM constraint layer (`papers/cdgm/layer.py`): corrections by hand, every official constraint file enforced,
schedules and devices agree, a property test on random feasible systems, boundaries."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iclr24_jax.papers import cdgm
from iclr24_jax.papers.cdgm import data as data_lib
from .helpers import CHAIN, FOUR


OFFICIAL_COUNTS = {"url": (8, 39), "wids": (31, 109), "lcld": (4, 28), "news": (5, 59), "botnet": (362, 757),
                   "heloc": (7, 23), "faults": (4, 27)}


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


# Correction of x = [12, 3, 20]: y_0 <= 10 -> 10; y_1 in [y_0, 10] = [10, 10] -> 10; y_2 in [y_1, 10] -> 10.
# Correction of x = [1, 0, 5]:   y_0 = 1; y_1 in [1, 10] -> 1; y_2 in [1, 10] -> 5.

@pytest.mark.parametrize("schedule", ["levels", "sequential", "scan"])
def test_chain_correction_by_hand(schedule):
  layer = cdgm.ConstraintLayer(cdgm.parse_constraints(CHAIN), 3, schedule=schedule)
  y = jax.jit(layer)(jnp.array([[12.0, 3.0, 20.0], [1.0, 0.0, 5.0]]))
  np.testing.assert_allclose(y, [[10, 10, 10], [1, 1, 5]], rtol=1e-6)


# Correction of x = [-5, 10, 9, 0] with epsilon = 0.25 (d1, d2, d3: FOUR's reduction, test_constraints.py):
#   y_0: lower -2.5 + 0.25 = -2.25                              -> -2.25
#   y_1: lower (c3) 1 - y_0 + 0.25 = 3.5, upper (d2) 3.5          -> 3.5
#   y_2: lower (d1) 2 y_1 - 4 = 3, upper (c4) 3                    -> 3
#   y_3: lower (c1) 2 y_1 = 7, upper (c2) y_2 + 4 = 7              -> 7
# and c3 holds strictly: 3.5 - 2.25 = 1.25 > 1.

def test_four_variable_correction_by_hand():
  c = cdgm.parse_constraints(FOUR)
  layer = cdgm.ConstraintLayer(c, 4, epsilon=0.25)
  x = jnp.array([[-5.0, 10.0, 9.0, 0.0]])
  y = jax.jit(layer)(x)
  np.testing.assert_allclose(y, [[-2.25, 3.5, 3.0, 7.0]], rtol=1e-6)
  assert bool(cdgm.satisfied(y, c, tol=0.0).all())   # exact check, strict inequality included
  assert layer.num_levels == 4                        # a chain: every variable reads the previous one


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
