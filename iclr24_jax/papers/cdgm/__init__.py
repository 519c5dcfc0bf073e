"""cdgm: How Realistic Is Your Synthetic Data? Constraining Deep Generative Models for Tabular Data.

Stoian, Dyrmishi, Cordy, Lukasiewicz, Giunchiglia (ICLR 2024). https://openreview.net/forum?id=tBROYsEz9G,
arXiv:2402.04823. Official code: https://github.com/mihaela-stoian/ConstrainedDGM (also PiShield).

A Constraint Layer (CL) turns linear inequalities over the features into a differentiable map onto the feasible
region: the constraints are reduced along a variable ordering with Fourier-Motzkin elimination, then each variable
is clipped, in order, into [max of its lower bounds, min of its upper bounds] computed from the earlier corrected
variables. Wrapping a deep generative model's inverse-transformed output with the CL (at training and sampling
time) gives a C-DGM whose samples always satisfy the constraints.

    from iclr24_jax.papers import cdgm
    cons = cdgm.parse_constraints(open("heloc_constraints.txt").read())
    layer = cdgm.ConstraintLayer(cons, num_features=24)
    y = jax.jit(layer)(x)                        # [B, 24] -> [B, 24], cdgm.satisfied(y, cons).all() == True
"""
from iclr24_jax.papers.cdgm.constraints import (Constraints, InfeasibleConstraintsError, Reduction, load_constraints,
                                                parse_constraints, reduce_constraints)
from iclr24_jax.papers.cdgm.layer import (ConstraintLayer, constraint_slack, on_boundary, satisfied,
                                         satisfied_per_constraint, violation_rate)
from iclr24_jax.papers.cdgm.model import CTGAN, TVAE
from iclr24_jax.papers.cdgm.orderings import correlation_ordering, correlation_scores, random_ordering

TITLE = "How Realistic Is Your Synthetic Data? Constraining Deep Generative Models for Tabular Data"
URL = "https://openreview.net/forum?id=tBROYsEz9G"
ARXIV = "https://arxiv.org/abs/2402.04823"
BIBTEX = """@inproceedings{stoian2024realistic,
  title     = {How Realistic Is Your Synthetic Data? Constraining Deep Generative Models for Tabular Data},
  author    = {Stoian, Mihaela C{\\u{a}}t{\\u{a}}lina and Dyrmishi, Salijona and Cordy, Maxime and
               Lukasiewicz, Thomas and Giunchiglia, Eleonora},
  booktitle = {The Twelfth International Conference on Learning Representations (ICLR)},
  year      = {2024},
  url       = {https://openreview.net/forum?id=tBROYsEz9G}
}"""

__all__ = [
    "parse_constraints", "load_constraints", "Constraints", "InfeasibleConstraintsError", "reduce_constraints",
    "Reduction", "ConstraintLayer", "satisfied", "satisfied_per_constraint", "violation_rate", "constraint_slack",
    "on_boundary",
    "random_ordering", "correlation_ordering", "correlation_scores", "TVAE", "CTGAN",
]
