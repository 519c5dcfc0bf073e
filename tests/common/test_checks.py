"""common.checks: the layout parser, static arguments, ranges, the poison and `iclr24_jax.checked`."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import iclr24_jax
from iclr24_jax.common import checks


def _demo(p, tau):
  """A miniature public function: [..., K] probabilities and a threshold in [0.5, 1]."""
  where = "demo"
  checks.shapes(where, p=(p, "... K"))
  ok = checks.all_ok(checks.probabilities(where, "p", p), checks.in_range(where, "tau", tau, 0.5, 1.0))
  return checks.poison(jnp.sum(jnp.asarray(p), -1) * tau, ok)


def test_layouts_bind_names_and_leading_dims():
  dims = checks.shapes("f", a=(np.zeros((4, 3)), "N F"), b=(np.zeros((4,)), "N"), c=(np.zeros((2, 5, 3)), "... F"))
  assert dims == {"N": 4, "F": 3}
  assert checks.shapes("f", x=(np.zeros((2, 4, 8, 8, 1)), "K B ...")) == {"K": 2, "B": 4}
  assert checks.shapes("f", x=(np.zeros(()), ""), y=(None, "N")) == {}
  with pytest.raises(checks.ShapeError, match=r"b must be \[N\] with N = 4 \(from a\); got shape \(3,\)"):
    checks.shapes("f", a=(np.zeros((4, 3)), "N F"), b=(np.zeros((3,)), "N"))
  with pytest.raises(checks.ShapeError, match=r"rank >= 1"):
    checks.shapes("f", x=(np.float32(1), "... V"))
  with pytest.raises(checks.ShapeError, match="size 2 where 3"):
    checks.shapes("f", x=(np.zeros((4, 2)), "N 3"))
  with pytest.raises(checks.ShapeError, match="with K = 5 \\(from given\\)"):
    checks.shapes("f", known={"K": 5}, x=(np.zeros((2,)), "K"))


def test_static_ints_choices_and_dtypes():
  assert checks.static_int("f", "n", np.int64(3), low=1) == 3
  assert checks.static_int("f", "n", jnp.int32(3)) == 3          # a concrete 0-d int array is fine eagerly
  with pytest.raises(checks.StaticArgumentError, match="static"):
    jax.jit(lambda n: checks.static_int("f", "n", n))(3)
  with pytest.raises(checks.StaticArgumentError, match="Python int"):
    checks.static_int("f", "n", 2.5)
  with pytest.raises(checks.HyperparameterError, match=r"n must be in \[1, 4\]; got 5"):
    checks.static_int("f", "n", 5, low=1, high=4)
  with pytest.raises(checks.StaticArgumentError, match="unknown mode 'max'"):
    checks.choice("f", "mode", "max", ("sum", "mean"))
  with pytest.raises(checks.DtypeError, match="integer dtype; got float32"):
    checks.dtype("f", "ids", np.zeros(3, np.float32), "integer")
  checks.dtype("f", "mask", np.zeros(3, bool), "int_or_bool")


def test_ranges_read_naturally():
  for kw, text in [(dict(low=0.0, low_open=True), "must be > 0"), (dict(low=0.0), "must be >= 0"),
                   (dict(low=0.5, high=1.0), r"must be in \[0.5, 1\]"),
                   (dict(low=0.0, high=1.0, low_open=True), r"must be in \(0, 1\]")]:
    with pytest.raises(checks.HyperparameterError, match=text):
      checks.in_range("f", "x", -1.0, **kw)
  with pytest.raises(checks.HyperparameterError):
    checks.in_range("f", "x", float("nan"), 0.0, 1.0)    # NaN is never in range
  assert checks.in_range("f", "x", 0.7, 0.5, 1.0) is True


def test_eager_raises_jit_poisons_vmap_per_row():
  p = np.array([[0.2, 0.3], [0.5, 1.7]], np.float32)
  with pytest.raises(checks.ProbabilityError, match="demo: p must be probabilities"):
    _demo(p, 0.7)
  assert np.isnan(np.asarray(jax.jit(_demo)(p, 0.7))).all()
  # vmap: each row is its own call, so only the bad row is poisoned (0.5 * 0.7 = 0.35 for the good row)
  np.testing.assert_allclose(np.asarray(jax.vmap(_demo, in_axes=(0, None))(p, 0.7)), [0.35, np.nan], rtol=1e-6)
  # a closed-over NumPy constant is checked on the host even inside a trace
  with pytest.raises(checks.ProbabilityError):
    jax.jit(lambda tau: _demo(p, tau))(0.7)


def test_poison_sentinels():
  tree = {"f": jnp.ones(2), "i": jnp.arange(2), "b": jnp.array([True, False])}
  assert checks.poison(tree, True) is tree
  out = checks.poison(tree, jnp.asarray(False), int_fill=-1, bool_fill=False)
  assert np.isnan(out["f"]).all() and (np.asarray(out["i"]) == -1).all() and not np.asarray(out["b"]).any()
  kept = checks.poison(tree, jnp.asarray(False))       # no sentinel given: integer / bool leaves pass through
  np.testing.assert_array_equal(kept["i"], [0, 1])


def test_host_array_guards_traces():
  with pytest.raises(checks.ContractError, match="runs on the host"):
    jax.jit(lambda x: checks.host_array("f", "x", x))(jnp.ones(2))
  np.testing.assert_array_equal(checks.host_array("f", "x", jnp.ones(2)), [1.0, 1.0])
  assert checks.xp(np.ones(2), 1.0) is np and checks.xp(jnp.ones(2)) is jnp


def test_checked_raises_named_errors_inside_jit_and_compiles_once():
  traces = []

  @chex.assert_max_traces(n=1)
  def demo(p, tau):
    traces.append(1)
    return _demo(p, tau)

  safe = iclr24_jax.checked(demo)
  good = np.array([[0.2, 0.3]], np.float32)
  np.testing.assert_allclose(safe(good, 0.7), [0.35], rtol=1e-6)
  with pytest.raises(checks.ProbabilityError, match=r"demo: p must be probabilities in \[0, 1\]"):
    safe(np.array([[0.2, 1.3]], np.float32), 0.7)      # same shape and tau: no retrace
  with pytest.raises(checks.HyperparameterError, match="tau"):
    iclr24_jax.checked(_demo)(good, jnp.float32(0.3))   # a traced hyperparameter: a runtime check
  with pytest.raises(checks.HyperparameterError, match="Got 0.3"):
    iclr24_jax.checked(_demo)(good, 0.3)                # a Python number is static: raised while tracing
  assert len(traces) == 1
  with pytest.raises(checks.CheckedCallError, match="outside jax.jit"):
    jax.jit(iclr24_jax.checked(_demo))(good, 0.7)
  # nested: a checked function inside another checked function is checked once, by the outer one
  outer = iclr24_jax.checked(lambda p: iclr24_jax.checked(_demo)(p, 0.7) * 2.0)
  with pytest.raises(checks.ProbabilityError):
    outer(np.array([[0.2, -0.1]], np.float32))


def test_checked_message_with_braces():
  f = iclr24_jax.checked(lambda y: checks.poison(y * 1.0, checks.labels_in("g", "y", y, (0, 1))))
  with pytest.raises(checks.LabelError, match=r"y must take values in \{0, 1\}"):
    f(np.array([0, 2]))
