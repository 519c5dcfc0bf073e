"""C-DGM constraints (`papers/cdgm/constraints.py`): parsing (official syntax, extensions, errors), reductions
by hand, infeasible sets named."""
from fractions import Fraction

import numpy as np
import pytest

from iclr24_jax.papers import cdgm
from iclr24_jax.papers.cdgm import data as data_lib
from .helpers import CHAIN, FOUR


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


# Reduction of CHAIN (last variable eliminated first):
#   set(y_2) = {c1: y_1 - y_0 >= 0, c2: -y_1 + y_2 >= 0, c3: -y_2 >= -10}
#   eliminate y_2: c2 (+y_2) + c3 (-y_2) = -y_1 >= -10          -> set(y_1) = {c1, -y_1 >= -10}
#   eliminate y_1: c1 (+y_1) + (-y_1 >= -10) = -y_0 >= -10      -> set(y_0) = {-y_0 >= -10}

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


# Reduction of FOUR:
#   eliminate y_3: c1 (y_3 >= 2 y_1) + c2 (y_3 <= y_2 + 4) -> d1: -2 y_1 + y_2 >= -4      set(y_2) = {c3, c4, d1}
#   eliminate y_2: d1 (+y_2) + c4 (-y_2 >= -3)               -> d2: -2 y_1 >= -7  (y_1 <= 3.5)   set(y_1) = {c3, d2}
#   eliminate y_1: 2*c3 (2 y_1 + 2 y_0 > 2) + d2             -> d3: 2 y_0 > -5    (y_0 > -2.5)   set(y_0) = {d3}

def test_four_variable_reduction_by_hand():
  r = cdgm.reduce_constraints(cdgm.parse_constraints(FOUR))
  assert [len(s) for s in r.sets] == [1, 2, 3, 4]
  (d3,) = r.rows_for(0)
  assert _norm(d3) == (((0, Fraction(1)),), Fraction(-5, 2), True)
  assert sorted(_norm(x) for x in r.rows_for(2)) == sorted([
      (((1, Fraction(-1)), (2, Fraction(1, 2))), Fraction(-2), False),  # d1 / |-2|: -y_1 + y_2 / 2 >= -2
      (((2, Fraction(-1)),), Fraction(-3), False)])                       # c4
  assert r.stats["combinations"] == 3


def test_infeasible_sets_name_the_conflict():
  with pytest.raises(cdgm.InfeasibleConstraintsError, match=r"y_0 >= 2.*- y_0 >= -1"):
    cdgm.ConstraintLayer(cdgm.parse_constraints("y_0 >= 2\n- y_0 >= -1\ny_1 >= 0"), 2)
  # A strict cycle: y_1 > y_0, y_2 > y_1, y_0 >= y_2 gives 0 > 0.
  with pytest.raises(cdgm.InfeasibleConstraintsError, match=r"#0.*#1.*#2"):
    cdgm.ConstraintLayer(cdgm.parse_constraints("y_1 - y_0 > 0\ny_2 - y_1 > 0\ny_0 - y_2 >= 0"), 3)
