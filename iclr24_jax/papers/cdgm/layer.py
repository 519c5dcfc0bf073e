"""The Constraint Layer: forward correction along the ordering, batched and jittable; satisfaction metrics.

For the variable x_k at position k, every constraint of its reduced set that mentions x_k gives a bound
    x_k >= (b - sum_{j != k} a_j x_j) / a_k   (a_k > 0, lower)      x_k <= (b - sum_{j != k} a_j x_j) / a_k   (a_k < 0, upper)
evaluated at the already-corrected earlier variables; strict inequalities are tightened by `epsilon` before the
reduction (`tighten_strict`).
The layer sets x_k <- min(max(x_k, max lower), min upper) (Eq. (4)-(5) of the paper; `get_final_x_correction` in
the official code: max with the lower bounds first, then min with the upper bounds).

Schedules (identical outputs, different compiled programs):
  'levels'     (default) variables whose bounds only read variables corrected in earlier groups are corrected
               together; a Python loop over these dependency levels is unrolled inside jit. For wids (31
               independent pairs) this is one step instead of 31.
  'sequential' one unrolled step per constrained variable, in ordering order (the paper's loop).
  'scan'       one `lax.scan` over the constrained variables with padded per-position bound tensors.
Bounds are stored sparsely: per row, the indices and coefficients of the variables it reads (gathered from x),
with variables bucketed by (rows, references) rounded up to powers of two.
"""
from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from fractions import Fraction

from iclr24_jax.common import checks

from iclr24_jax.papers.cdgm.constraints import (Constraints, InfeasibleConstraintsError, Reduction, Row, build_constraints,
                                                reduce_constraints)

Schedule = Literal["levels", "sequential", "scan"]


@dataclasses.dataclass(frozen=True)
class _Group:
  """Variables corrected together from gathered values: bound[m, r] = const[m, r] - sum_k coef[m, r, k] x[idx[m, r, k]]."""

  vars: np.ndarray      # [M] int32 feature indices
  idx: np.ndarray       # [M, R, K] int32 feature indices read by the bounds (padding: index 0, coefficient 0)
  coef: np.ndarray      # [M, R, K] float
  const: np.ndarray     # [M, R] float
  lower: np.ndarray     # [M, R] bool
  upper: np.ndarray     # [M, R] bool


def _position_bounds(reduction: Reduction, position: int):
  """Rows of one position as (g: {var: a_u / a_k} over the other vars, b / a_k, is_lower)."""
  v = reduction.ordering[position]
  out = []
  for r in reduction.rows_for(position):
    a = r.coef(v)
    g = {u: c / a for u, c in r.coeffs if u != v}  # bound = b/a - sum_u g_u x_u
    out.append((g, float(r.constant / a), bool(a > 0)))
  return v, out


def tighten_strict(constraints: Constraints, epsilon: float) -> Constraints:
  """Replaces every strict `a.x > b` by the non-strict `a.x >= b + epsilon * max_j |a_j|`.

  Deviation: the official code adds epsilon (1e-12) to each bound of a strict row at correction time, also for
  rows derived by the reduction. That margin does not compose: e.g. {2 y_1 + y_2 >= -0.5, -y_1 > -0.5} with
  ordering (y_2, y_1) derives y_2 > -1.5, and with a per-bound epsilon of 1e-3 the interval left for y_1 is
  [0.4995, 0.499], empty (found by the property test). Tightening the original rows before the reduction makes the
  reduced system exact, so the correction is guaranteed whenever the tightened system is feasible.
  """
  rows, texts = [], []
  for r, t in zip(constraints.rows, constraints.texts):
    if r.strict:
      scale = max(abs(a) for _, a in r.coeffs)
      r = Row(r.coeffs, r.constant + Fraction(epsilon) * scale, False, r.history)
    rows.append(r)
    texts.append(t)
  return build_constraints(rows, texts, constraints.ordering, constraints.num_variables)


def _pow2(n: int) -> int:
  return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _make_group(items, dtype, r_pad: int | None = None, k_pad: int | None = None) -> _Group:
  """items: list of (var, rows) with rows = [(g dict, c, lower)]; pads rows to R and references to K."""
  r_max = r_pad or max(len(rows) for _, rows in items)
  k_max = k_pad if k_pad is not None else max(len(g) for _, rows in items for g, _, _ in rows)
  m = len(items)
  idx = np.zeros((m, r_max, k_max), np.int32)
  coef = np.zeros((m, r_max, k_max), np.float64)
  const = np.zeros((m, r_max), np.float64)
  lower = np.zeros((m, r_max), bool)
  upper = np.zeros((m, r_max), bool)
  for i, (_, rows) in enumerate(items):
    for j, (g, c, lo) in enumerate(rows):
      for k, (u, val) in enumerate(sorted(g.items())):
        idx[i, j, k], coef[i, j, k] = u, float(val)
      const[i, j] = c
      lower[i, j], upper[i, j] = lo, not lo
  return _Group(vars=np.array([v for v, _ in items], np.int32), idx=idx, coef=coef.astype(dtype),
                const=const.astype(dtype), lower=lower, upper=upper)


def _bucketed(items, dtype) -> list[_Group]:
  """Splits one level's variables by (rows, references) rounded up to powers of two, so padding wastes < 2x."""
  buckets: dict[tuple[int, int], list] = {}
  for v, rows in items:
    key = (_pow2(len(rows)), _pow2(max(len(g) for g, _, _ in rows)) if any(g for g, _, _ in rows) else 0)
    buckets.setdefault(key, []).append((v, rows))
  return [_make_group(its, dtype, r, k) for (r, k), its in sorted(buckets.items())]


class ConstraintLayer:
  """Maps any [B, D] batch onto the region defined by linear constraints (the paper's CL).

  The reduction is computed once, here, on the host; calling the layer is pure, jittable and differentiable
  almost everywhere (it is a composition of affine maps, max, min).

  Args:
    constraints: parsed `Constraints` (their ordering is the correction order).
    num_features: D, the width of the inputs (constrained variables must be < D; others pass through).
    epsilon: margin for strict inequalities: `a.x > b` is enforced as `a.x >= b + epsilon * max|a|` (see
      `tighten_strict`; the official 1e-12 is below float32 resolution).
    schedule: 'levels' (default), 'sequential' or 'scan' (see module docstring).
    prune: prune redundant reduced constraints (does not change outputs; see `constraints.py`).
    dtype: the bound tensors' dtype (inputs are cast to it).

  The layer is a pytree without array leaves (its bound tensors are compile-time constants of the host-side
  reduction), so it can be passed to a jitted function as an argument (one compilation per layer object) or
  closed over:

    layer = cdgm.ConstraintLayer(constraints, num_features)
    correct = jax.jit(lambda layer, x: layer(x))
    y = correct(layer, x)

  Raises:
    InfeasibleConstraintsError: if the constraints have no solution (the message names the conflicting ones).
    ValueError: if a constrained variable index is >= num_features or the schedule is unknown.
  """

  def __init__(self, constraints: Constraints, num_features: int, *, epsilon: float = 1e-6,
               schedule: Schedule = "levels", prune: bool = True, dtype=jnp.float32):
    where = "cdgm.ConstraintLayer"
    checks.choice(where, "schedule", schedule, ("levels", "sequential", "scan"))
    num_features = checks.static_int(where, "num_features", num_features, low=1)
    used = constraints.constrained_variables
    if used and max(used) >= num_features:
      raise checks.ShapeError(f"{where}: constraint variable y_{max(used)} does not exist in inputs with "
                              f"num_features={num_features}; pass the full feature width (or fix the constraints "
                              "file).")
    checks.in_range(where, "epsilon", epsilon, 0.0, None, hint="the margin of strict inequalities.")
    self.constraints = constraints
    self.num_features = int(num_features)
    self.epsilon = float(epsilon)
    self.schedule = schedule
    self.dtype = jnp.dtype(dtype)
    self.reduction = reduce_constraints(constraints, prune=prune)   # exact feasibility check (strictness kept)
    if constraints.strict.any():
      try:
        self.reduction = reduce_constraints(tighten_strict(constraints, self.epsilon), prune=prune)
      except InfeasibleConstraintsError as e:
        raise InfeasibleConstraintsError(f"the strict constraints leave less room than epsilon={self.epsilon}; "
                                         f"use a smaller epsilon ({e})") from e
    positions = []
    for k in range(len(self.reduction.ordering)):
      v, rows = _position_bounds(self.reduction, k)
      if rows:
        positions.append((v, rows))
    self._positions = positions
    # Dependency levels: a variable's level is 1 + the largest level among the corrected variables it reads.
    level: dict[int, int] = {}
    for v, rows in positions:
      level[v] = 1 + max([level.get(u, 0) for g, _, _ in rows for u in g], default=0)
    self.num_levels = max(level.values(), default=0)
    if schedule == "levels":
      steps = [[(v, rows) for v, rows in positions if level[v] == lv] for lv in range(1, self.num_levels + 1)]
    else:
      steps = [[p] for p in positions]
    self._steps = [_bucketed(st, self.dtype) for st in steps if st]   # per step: buckets computed from the same x
    if schedule == "scan" and positions:
      self._scan = _make_group(positions, self.dtype)

  @property
  def stats(self) -> dict:
    """Reduction sizes and the compiled structure (positions, levels, groups)."""
    s = dict(self.reduction.stats)
    s.pop("rows_per_level", None)
    s.update(active_positions=len(self._positions), num_levels=self.num_levels, num_steps=len(self._steps),
             num_buckets=sum(len(st) for st in self._steps), schedule=self.schedule)
    return s

  def __repr__(self) -> str:
    return (f"ConstraintLayer(num_constraints={self.constraints.num_constraints}, num_features={self.num_features}, "
            f"active_positions={len(self._positions)}, levels={self.num_levels}, schedule='{self.schedule}')")

  # ------------------------------------------------------------------------------------------------------------
  def __call__(self, x: jax.Array) -> jax.Array:
    """Corrects a batch.

    Args:
      x: [..., D] values in the original (inverse-transformed) feature space (any leading batch dims).

    Returns:
      [..., D] values satisfying every constraint; unconstrained columns are unchanged, and rows that already
      satisfy the constraints are returned unchanged (up to the strict-inequality epsilon). NaN inputs give NaN
      in the corrected columns (max / min propagate NaN).
    """
    if np.ndim(x) < 1 or np.shape(x)[-1] != self.num_features:
      raise checks.ShapeError(f"cdgm.ConstraintLayer: the layer was built for num_features={self.num_features}; "
                              f"x must be [..., {self.num_features}], got shape {np.shape(x)}.")
    x = jnp.asarray(x)
    lead = x.shape[:-1]
    x = x.reshape((-1, x.shape[-1])).astype(self.dtype)
    if self.schedule == "scan" and self._positions:
      x = self._call_scan(x)
    else:
      for buckets in self._steps:
        # Every bucket of a step reads only variables finished in earlier steps, so all new values come from the
        # same x and are written with one scatter.
        new = [_clipped(x, g) for g in buckets]
        cols = np.concatenate([g.vars for g in buckets])
        x = x.at[:, cols].set(jnp.concatenate(new, axis=1) if len(new) > 1 else new[0])
    return x.reshape(lead + (self.num_features,))

  def _call_scan(self, x):
    g = self._scan

    def step(x, p):
      var, idx, coef, const, lower, upper = p                        # [], [R, K], [R, K], [R], [R], [R]
      xs = jnp.take(x, idx.reshape(-1), axis=1).reshape(x.shape[0], *idx.shape)
      bounds = const[None] - jnp.sum(xs * coef[None], -1)              # [B, R]
      lo = jnp.max(jnp.where(lower[None], bounds, -jnp.inf), axis=1)
      hi = jnp.min(jnp.where(upper[None], bounds, jnp.inf), axis=1)
      cur = jax.lax.dynamic_index_in_dim(x, var, axis=1, keepdims=False)
      new = jnp.minimum(jnp.maximum(cur, lo), hi)
      return jax.lax.dynamic_update_index_in_dim(x, new, var, axis=1), None

    x, _ = jax.lax.scan(step, x, (g.vars, g.idx, g.coef, g.const, g.lower, g.upper))
    return x


# A pytree without array leaves: the layer itself is the (identity-hashed) static aux data, so it can be an
# argument of a jitted function.
jax.tree_util.register_pytree_node(ConstraintLayer, lambda layer: ((), layer), lambda layer, _: layer)


def _clipped(x: jax.Array, g: _Group) -> jax.Array:
  """New values [B, M] of a bucket: x[:, vars] clipped into [max lower, min upper] (Eq. (4)-(5))."""
  m, r, k = g.idx.shape
  if k == 0:   # constant bounds (e.g. y_1 >= 36): no gather, and no [B, ...] constant for XLA to fold
    bounds = g.const[None]                                                       # [1, M, R]
  else:
    xs = jnp.take(x, g.idx.reshape(-1), axis=1).reshape(x.shape[0], m, r, k)   # [B, M, R, K]
    bounds = g.const[None] - jnp.sum(xs * g.coef[None], -1)                     # [B, M, R]
  lo = jnp.max(jnp.where(g.lower[None], bounds, -jnp.inf), axis=-1)             # [B or 1, M]
  hi = jnp.min(jnp.where(g.upper[None], bounds, jnp.inf), axis=-1)
  return jnp.minimum(jnp.maximum(x[:, g.vars], lo), hi)                         # max with lower, then min with upper


# --------------------------------------------------------------------------------------------------------------
# Satisfaction
# --------------------------------------------------------------------------------------------------------------


def _coefficients_for(constraints: Constraints, width: int) -> np.ndarray:
  a = constraints.coefficients
  if a.shape[1] > width:
    if np.any(a[:, width:] != 0):
      raise checks.ShapeError(f"cdgm: inputs of width {width} lack constrained variables up to "
                              f"y_{a.shape[1] - 1}.")
    a = a[:, :width]
  elif a.shape[1] < width:
    a = np.pad(a, ((0, 0), (0, width - a.shape[1])))
  return a


def constraint_slack(x: jax.Array, constraints: Constraints) -> tuple[jax.Array, jax.Array]:
  """Slack `A x - b` of every constraint and its scale `1 + |A| |x| + |b|`.

  Args:
    x: [B, D] values.
    constraints: the constraints.

  Returns:
    (slack [..., C], scale [..., C]).
  """
  checks.shapes("cdgm.constraint_slack", x=(x, "... D"))
  x = jnp.asarray(x)
  a = _coefficients_for(constraints, x.shape[-1])
  dtype = jnp.promote_types(x.dtype, jnp.float32)
  x = x.astype(dtype)
  a_j = jnp.asarray(a, dtype)
  b = jnp.asarray(constraints.constants, dtype)
  slack = x @ a_j.T - b[None]
  scale = 1.0 + jnp.abs(x) @ jnp.abs(a_j).T + jnp.abs(b)[None]
  return slack, scale


def satisfied_per_constraint(x: jax.Array, constraints: Constraints, tol: float = 1e-6) -> jax.Array:
  """[..., C] bool: constraint c holds for row b (relative tolerance, see `satisfied`)."""
  checks.in_range("cdgm.satisfied", "tol", tol, 0.0, None, hint="a relative tolerance (0 = exact).")
  slack, scale = constraint_slack(x, constraints)
  thr = -tol * scale
  strict = jnp.asarray(constraints.strict)[None]
  return jnp.where(strict, slack > thr, slack >= thr)


def satisfied(x: jax.Array, constraints: Constraints, tol: float = 1e-6) -> jax.Array:
  """Which rows satisfy every constraint.

  A constraint `a.x >= b` holds when `a.x - b >= -tol * (1 + |a|.|x| + |b|)` (a relative tolerance, so float32
  rounding of large features such as faults' 2.5e6 pixel coordinates is not a violation); `a.x > b` uses `>` in
  place of `>=`. With tol=0 the check is exact. NaN rows count as violating.

  Args:
    x: [..., D] values in the original feature space.
    constraints: the constraints.
    tol: relative tolerance (>= 0).

  Returns:
    [...] bool.
  """
  return jnp.all(satisfied_per_constraint(x, constraints, tol), axis=-1)


def violation_rate(x: jax.Array, constraints: Constraints, tol: float = 1e-6) -> jax.Array:
  """Fraction of rows that violate at least one constraint (the paper's 'samples violating constraints').

  Args:
    x: [B, D] values.
    constraints: the constraints.
    tol: relative tolerance (see `satisfied`).

  Returns:
    A float32 scalar in [0, 1] (a 0-d array; `float()` it on the host).
  """
  return 1.0 - jnp.mean(satisfied(x, constraints, tol).astype(jnp.float32))


def on_boundary(x: jax.Array, constraints: Constraints, tol: float = 1e-6) -> jax.Array:
  """Which rows sit exactly on a constraint boundary: some constraint holds with equality, |A x - b| <= tol * scale.

  The Constraint Layer projects a violating variable onto the nearest bound, so corrected rows land on a boundary
  (e.g. `X_Maximum = X_Minimum + epsilon`); this counts how often that happens, for synthetic and real rows alike.

  Args:
    x: [B, D] values in the original feature space.
    constraints: the constraints.
    tol: relative tolerance (the scale of `constraint_slack`); a strict row's margin epsilon is within it.

  Returns:
    [B] bool.
  """
  slack, scale = constraint_slack(x, constraints)
  return jnp.any(jnp.abs(slack) <= tol * scale, axis=-1)
