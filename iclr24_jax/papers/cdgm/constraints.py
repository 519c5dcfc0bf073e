"""Linear constraints: the official text format, the `Constraints` container and the Fourier-Motzkin reduction.

Text format (as in mihaela-stoian/ConstrainedDGM `data/*/*_constraints.txt`):

    ordering y_0 y_1 y_2            # optional here (required by the official parser)
    y_1 - y_2 >= 0                  # one inequality per line
    y_0 - 3y_19 - y_3 > 0           # integer or real coefficients, '3y_19' or '3*y_19'
    - y_1 >= -60                    # constants on either side
    y_2 <= y_0 + 5                  # extension: '<=', '<' and '=' (an equality becomes two inequalities)

Every inequality is stored in the normal form `sum_j a_j x_j  (> | >=)  b`.

The reduction (Sec. 4 of the paper, `compute_sets_of_constraints.py` in the official code) walks the ordering
from the last variable back: the set of x_k keeps the constraints of the set of x_{k+1} that do not mention
x_{k+1} and adds, for each pair of a positive and a negative occurrence of x_{k+1}, their combination that
eliminates it (Fourier-Motzkin). Arithmetic is exact (`fractions.Fraction`), so deduplication is exact.
Redundant combinations are pruned with two sound rules that do not change the feasible set of any level:
  * duplicates (the same normalised left-hand side) keep only the tightest right-hand side;
  * Chernikov's rule: a combination of |H| original constraints is not an extreme ray of the elimination cone
    (hence implied by the others) when |H| > 1 + (number of eliminated variables occurring in H).
Because the corrected prefix always lies in the projection, the clip interval of each variable is the same with
and without the pruned constraints, so the layer's output is unchanged by the pruning.
"""
from __future__ import annotations

import dataclasses
import re
import time
from fractions import Fraction
from typing import Sequence

import numpy as np


class InfeasibleConstraintsError(ValueError):
  """The constraint set has no solution; the message names the conflicting constraints."""


# --------------------------------------------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------------------------------------------

_ZERO = Fraction(0)
_OPS = (">=", "<=", "==", ">", "<", "=")
_TERM = re.compile(r"\s*([+-])?\s*(\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)?\s*(\*)?\s*(?:y_?(\d+))?\s*")
_VAR = re.compile(r"^y_?(\d+)$")


@dataclasses.dataclass(frozen=True, eq=False)
class Row:
  """One inequality `sum_j coeffs[j] * x_j (> if strict else >=) constant` with exact coefficients.

  Attributes:
    coeffs: variable index -> nonzero Fraction coefficient.
    constant: the right-hand side.
    strict: '>' (True) or '>=' (False).
    history: bitmask of the original constraints this row is a nonnegative combination of.
  """

  coeffs: tuple[tuple[int, Fraction], ...]
  constant: Fraction
  strict: bool
  history: int
  _lookup: dict = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    object.__setattr__(self, "_lookup", dict(self.coeffs))

  def coef(self, var: int) -> Fraction:
    return self._lookup.get(var, _ZERO)

  def variables(self) -> tuple[int, ...]:
    return tuple(v for v, _ in self.coeffs)


def _parse_side(expr: str, line: str) -> tuple[dict[int, Fraction], Fraction]:
  """Parses a linear expression into ({var: coef}, constant)."""
  coeffs: dict[int, Fraction] = {}
  constant = Fraction(0)
  expr = expr.strip()
  pos, first = 0, True
  if not expr:
    raise ValueError(f"empty side in constraint '{line}'.")
  while pos < len(expr):
    m = _TERM.match(expr, pos)
    if m is None or m.end() == pos:
      raise ValueError(f"cannot parse '{expr[pos:]}' in constraint '{line}'; expected terms like '3y_1', "
                       "'- 0.5*y_2' or a number.")
    sign, num, star, var = m.group(1), m.group(2), m.group(3), m.group(4)
    if num is None and var is None:
      raise ValueError(f"cannot parse '{expr[pos:].strip()}' in constraint '{line}' (a dangling sign, or a variable "
                       "not named y_<index>).")
    if sign is None and not first:
      raise ValueError(f"missing '+' or '-' before '{m.group(0).strip()}' in constraint '{line}'.")
    if star and (num is None or var is None):
      raise ValueError(f"misplaced '*' near '{m.group(0).strip()}' in constraint '{line}'.")
    value = Fraction(num) if num is not None else Fraction(1)
    if sign == "-":
      value = -value
    if var is None:
      constant += value
    else:
      v = int(var)
      coeffs[v] = coeffs.get(v, Fraction(0)) + value  # repeated variables are collapsed
    pos, first = m.end(), False
  return coeffs, constant


def _parse_inequality(line: str) -> list[tuple[dict[int, Fraction], Fraction, bool, str]]:
  low = line.lower()
  if re.search(r"\b(or|neg)\b", low):
    raise ValueError(f"disjunctive/negated constraints are not supported by the linear Constraint Layer: '{line}' "
                     "(the ICLR 2024 layer handles conjunctions of linear inequalities only).")
  found = [(m.start(), m.group(0)) for m in re.finditer(r">=|<=|==|>|<|=", line)]
  if len(found) != 1:
    raise ValueError(f"constraint '{line}' must contain exactly one of {', '.join(_OPS)}; found "
                     f"{[op for _, op in found] or 'none'}.")
  at, op = found[0]
  left, lc = _parse_side(line[:at], line)
  right, rc = _parse_side(line[at + len(op):], line)
  # lhs - rhs (op) 0  ->  sum a_j x_j (op) rc - lc
  body = dict(left)
  for v, a in right.items():
    body[v] = body.get(v, Fraction(0)) - a
  body = {v: a for v, a in body.items() if a != 0}
  b = rc - lc
  neg = {v: -a for v, a in body.items()}
  if op in (">=", ">"):
    return [(body, b, op == ">", line)]
  if op in ("<=", "<"):
    return [(neg, -b, op == "<", line)]
  # '=' / '==': two non-strict inequalities.
  return [(body, b, False, line + "  [>= half]"), (neg, -b, False, line + "  [<= half]")]


@dataclasses.dataclass(frozen=True, eq=False)
class Constraints:
  """A conjunction of linear inequalities `coefficients @ x (> | >=) constants` and a variable ordering.

  Attributes:
    ordering: variable indices in correction order (first corrected first); covers every constrained variable.
    coefficients: [C, V] float64 coefficient matrix (V = num_variables).
    constants: [C] float64 right-hand sides.
    strict: [C] bool, True for '>'.
    texts: the source line of each constraint (for error messages).
    rows: the exact (Fraction) form of each constraint, used by the reduction.
  """

  ordering: tuple[int, ...]
  coefficients: np.ndarray
  constants: np.ndarray
  strict: np.ndarray
  texts: tuple[str, ...]
  rows: tuple[Row, ...] = dataclasses.field(repr=False)

  @property
  def num_constraints(self) -> int:
    return len(self.rows)

  @property
  def num_variables(self) -> int:
    """1 + the largest variable index mentioned (in a constraint or in the ordering)."""
    return int(self.coefficients.shape[1])

  @property
  def constrained_variables(self) -> tuple[int, ...]:
    """Sorted indices of the variables that occur in at least one constraint."""
    return tuple(int(i) for i in np.nonzero(np.any(self.coefficients != 0, axis=0))[0])

  def with_ordering(self, ordering: Sequence[int]) -> "Constraints":
    """The same constraints with another variable ordering.

    Args:
      ordering: variable indices; must contain every constrained variable exactly once (other variables are
        allowed and ignored by the layer).

    Returns:
      A new `Constraints`.
    """
    return build_constraints(self.rows, self.texts, tuple(int(o) for o in ordering), self.num_variables)

  def describe(self, i: int) -> str:
    """Human-readable text of constraint i (its source line)."""
    return f"#{i} '{self.texts[i]}'"


def build_constraints(rows: Sequence[Row], texts: Sequence[str], ordering: tuple[int, ...] | None,
                      min_vars: int = 0) -> Constraints:
  """Assembles a `Constraints` set from parsed rows.

  Args:
    rows: the parsed linear inequalities (each `Row` has coeffs [(variable, coefficient)], a constant, an op).
    texts: the source text of each row (for error messages).
    ordering: the variable ordering the layer corrects in (None: ascending variable index).
    min_vars: at least this many variables (so a set over fewer columns still covers the table).

  Returns:
    The Constraints set.
  """
  used = sorted({v for r in rows for v, _ in r.coeffs})
  if ordering is None:
    ordering = tuple(used)
  if len(set(ordering)) != len(ordering):
    dup = sorted({o for o in ordering if list(ordering).count(o) > 1})
    raise ValueError(f"the ordering lists variables more than once: {['y_%d' % d for d in dup]}.")
  if any(o < 0 for o in ordering):
    raise ValueError("ordering indices must be nonnegative.")
  missing = sorted(set(used) - set(ordering))
  if missing:
    raise ValueError(f"the ordering does not include the constrained variables {['y_%d' % m for m in missing]}; "
                     "add them to the 'ordering' line (every variable in a constraint needs a position).")
  num_vars = max([min_vars, 1 + max(used, default=-1), 1 + max(ordering, default=-1)])
  coefficients = np.zeros((len(rows), num_vars), np.float64)
  for i, r in enumerate(rows):
    for v, a in r.coeffs:
      coefficients[i, v] = float(a)
  constants = np.array([float(r.constant) for r in rows], np.float64)
  strict = np.array([r.strict for r in rows], bool)
  return Constraints(ordering=tuple(ordering), coefficients=coefficients, constants=constants, strict=strict,
                     texts=tuple(texts), rows=tuple(rows))


def parse_constraints(text: str) -> Constraints:
  """Parses constraints in the official text format.

  Args:
    text: the file contents: an optional `ordering y_i y_j ...` line and one linear inequality per line
      (`>=`, `>`, and as extensions `<=`, `<`, `=`; `#` starts a comment). Without an ordering line the
      variables are ordered by index.

  Returns:
    `Constraints` (ordering, [C, V] coefficients, [C] constants, [C] strictness).

  Raises:
    ValueError: on a malformed line (naming it) or an ordering that misses a constrained variable.
    InfeasibleConstraintsError: when a single line is unsatisfiable by itself (e.g. `0 >= 1`).
  """
  ordering: tuple[int, ...] | None = None
  rows: list[Row] = []
  texts: list[str] = []
  for raw in text.splitlines():
    line = raw.split("#", 1)[0].strip()
    if not line:
      continue
    if line.lower().startswith("ordering"):
      if ordering is not None:
        raise ValueError("more than one 'ordering' line.")
      names = line.split()[1:]
      idx = []
      for n in names:
        m = _VAR.match(n)
        if not m:
          raise ValueError(f"bad variable '{n}' in the ordering line; use names like y_0 y_1 ...")
        idx.append(int(m.group(1)))
      ordering = tuple(idx)
      continue
    for body, b, strict, src in _parse_inequality(line):
      if not body:
        ok = (0 > b) if strict else (0 >= b)
        if not ok:
          raise InfeasibleConstraintsError(f"constraint '{src}' has no variables and is false (0 {'>' if strict else '>='} "
                                           f"{b}); remove or fix it.")
        continue  # a true constant constraint carries no information
      k = len(rows)
      rows.append(Row(tuple(sorted(body.items())), b, strict, 1 << k))
      texts.append(src)
  if not rows and ordering is None:
    raise ValueError("no constraints found in the text.")
  return build_constraints(rows, texts, ordering)


def load_constraints(path) -> Constraints:
  """Reads and parses a constraints file (see `parse_constraints`)."""
  with open(path) as f:
    return parse_constraints(f.read())


# --------------------------------------------------------------------------------------------------------------
# Fourier-Motzkin reduction
# --------------------------------------------------------------------------------------------------------------


def _normalise(coeffs: dict[int, Fraction], constant: Fraction) -> tuple[tuple, Fraction]:
  """Scales a row so its first coefficient has magnitude 1; returns (key, scaled constant)."""
  items = sorted(coeffs.items())
  scale = abs(items[0][1])
  return tuple((v, a / scale) for v, a in items), constant / scale


def _combine(p: Row, q: Row, var: int) -> tuple[dict[int, Fraction], Fraction, bool, int]:
  """Positive combination of p (coef of var > 0) and q (coef < 0) that eliminates var."""
  ap, aq = p.coef(var), -q.coef(var)  # both > 0
  # aq * p + ap * q: coefficient of var is aq*ap - ap*aq = 0.
  # Deviation: the official code scales p's body by aq/ap but not its constant and keeps p's strictness; here both
  # rows are scaled consistently (constant included) and the result is strict if either input is strict.
  out: dict[int, Fraction] = {}
  for v, a in p.coeffs:
    if v != var:
      out[v] = a * aq
  for v, a in q.coeffs:
    if v != var:
      out[v] = out.get(v, Fraction(0)) + a * ap
  out = {v: a for v, a in out.items() if a != 0}
  return out, p.constant * aq + q.constant * ap, p.strict or q.strict, p.history | q.history


@dataclasses.dataclass(frozen=True)
class Reduction:
  """The per-variable constraint sets of the reduction.

  Attributes:
    ordering: the variable ordering.
    sets: sets[k] are the rows over ordering[:k+1] (the set of variable ordering[k]).
    stats: sizes and timing (rows per level, combinations made/pruned, seconds).
  """

  ordering: tuple[int, ...]
  sets: tuple[tuple[Row, ...], ...]
  stats: dict

  def rows_for(self, position: int) -> tuple[Row, ...]:
    """Rows of the set at `position` that mention ordering[position] (the ones the correction uses)."""
    v = self.ordering[position]
    return tuple(r for r in self.sets[position] if r.coef(v) != 0)


def _explain(history: int, constraints: Constraints) -> str:
  idx = [i for i in range(constraints.num_constraints) if history >> i & 1]
  return "; ".join(constraints.describe(i) for i in idx)


def reduce_constraints(constraints: Constraints, prune: bool = True, max_rows: int = 200_000) -> Reduction:
  """Fourier-Motzkin reduction along `constraints.ordering` (last variable eliminated first).

  Args:
    constraints: parsed constraints.
    prune: drop redundant combinations (duplicates, Chernikov's rule); False reproduces plain FM (official).
    max_rows: abort with a clear error when a level grows beyond this many rows (combinatorial blow-up).

  Returns:
    A `Reduction` with one set per ordering position.

  Raises:
    InfeasibleConstraintsError: naming the original constraints whose combination is contradictory.
    RuntimeError: when a level exceeds `max_rows`.
  """
  t0 = time.perf_counter()
  order = constraints.ordering
  n = len(order)
  var_masks = []  # bitmask of variables per original constraint (for Chernikov's rule)
  for r in constraints.rows:
    m = 0
    for v, _ in r.coeffs:
      m |= 1 << v
    var_masks.append(m)

  def hist_vars(history: int) -> int:
    m, i = 0, 0
    h = history
    while h:
      if h & 1:
        m |= var_masks[i]
      h >>= 1
      i += 1
    return m

  def better(r: Row, c: Fraction, cur: tuple[Fraction, Row] | None) -> bool:
    if cur is None:
      return True
    cc, cr = cur
    if c != cc:
      return c > cc  # the tighter right-hand side implies the looser one
    if r.strict != cr.strict:
      return r.strict
    return r.history.bit_count() < cr.history.bit_count()

  # The current set as {normalised left-hand side: (normalised constant, row)}; with prune=False the key is the
  # row's position, so nothing is merged.
  current: dict = {}
  for i, r in enumerate(constraints.rows):
    if prune:
      key, c = _normalise(dict(r.coeffs), r.constant)
      if better(r, c, current.get(key)):
        current[key] = (c, r)
    else:
      current[("orig", i)] = (r.constant, r)
  sets: list[tuple[Row, ...]] = [()] * n
  level_sizes = [0] * n
  made = pruned_dup = pruned_chernikov = 0
  eliminated_mask = 0
  fresh = 0
  for k in range(n - 1, -1, -1):
    sets[k] = tuple(r for _, r in current.values())
    level_sizes[k] = len(current)
    var = order[k]
    pos, neg, rest = [], [], {}
    for key, (c, r) in current.items():
      a = r.coef(var)
      if a > 0:
        pos.append(r)
      elif a < 0:
        neg.append(r)
      else:
        rest[key] = (c, r)
    eliminated_mask |= 1 << var
    for p in pos:
      for q in neg:
        body, b, strict, hist = _combine(p, q, var)
        made += 1
        if not body:
          ok = (0 > b) if strict else (0 >= b)
          if not ok:
            raise InfeasibleConstraintsError(
                "the constraints are infeasible: eliminating the variables gives "
                f"0 {'>' if strict else '>='} {float(b):g}, a contradiction implied by: "
                f"{_explain(hist, constraints)}.")
          continue
        if prune and hist.bit_count() > 1 + (hist_vars(hist) & eliminated_mask).bit_count():
          pruned_chernikov += 1
          continue
        if prune:
          key, c = _normalise(body, b)
          row = Row(key, c, strict, hist)  # stored scaled (first |coefficient| = 1) so Fractions stay small
          if key in rest:
            pruned_dup += 1
          if better(row, c, rest.get(key)):
            rest[key] = (c, row)
        else:
          fresh += 1
          rest[("new", fresh)] = (b, Row(tuple(sorted(body.items())), b, strict, hist))
    if len(rest) > max_rows:
      raise RuntimeError(f"the reduction exceeded {max_rows} rows after eliminating y_{var} "
                         f"({len(rest)} rows): try another ordering or fewer constraints.")
    current = rest
  active = sum(1 for k in range(n) for r in sets[k] if r.coef(order[k]) != 0)
  stats = {"num_constraints": constraints.num_constraints, "num_positions": n, "active_rows": int(active),
           "rows_per_level": level_sizes, "total_rows": int(sum(level_sizes)),
           "max_rows": int(max(level_sizes, default=0)), "combinations": made,
           "pruned_duplicates": pruned_dup, "pruned_chernikov": pruned_chernikov,
           "seconds": time.perf_counter() - t0}
  return Reduction(ordering=order, sets=tuple(sets), stats=stats)
