"""Classification with Conceptual Safeguards (Joren, Marx, Ustun; ICLR 2024) in JAX.

arXiv: https://arxiv.org/abs/2411.04342 . Official code: https://github.com/hljames/conceptual_safeguards

A conceptual safeguard predicts y from calibrated concept probabilities through a front-end model, propagates the
concept uncertainty into Pr(y | x), abstains where it is not confident enough for a target accuracy, and lets a
human confirm the most informative concepts on abstained instances.
"""
from iclr24_jax.papers.safeguards.data import (ConceptDataset, ConceptSplit, digit_concepts, load_concept_dataset,
                                               make_digits_concepts, make_synthetic)
from iclr24_jax.papers.safeguards.model import (ConceptMLP, calibrated_probs, create_detector, detector_loss,
                                                fit_calibration, fit_front_end, front_end_loss,
                                                make_detector_train_step)
from iclr24_jax.papers.safeguards.propagation import (assignments, concept_outcomes, logistic_front_end, propagate,
                                                      propagate_exact, propagate_mc)
from iclr24_jax.papers.safeguards.safeguard import (abstain_mask, apply_confirmation, choose_threshold, confidence,
                                                    confirm, confirmation_scores, coverage_accuracy,
                                                    select_top_global, select_top_per_concept)

TITLE = "Classification with Conceptual Safeguards"
URL = "https://arxiv.org/abs/2411.04342"
CODE = "https://github.com/hljames/conceptual_safeguards"
BIBTEX = """@inproceedings{joren2024classification,
  title     = {Classification with Conceptual Safeguards},
  author    = {Joren, Hailey and Marx, Charles and Ustun, Berk},
  booktitle = {The Twelfth International Conference on Learning Representations (ICLR)},
  year      = {2024},
  url       = {https://arxiv.org/abs/2411.04342}
}"""

__all__ = [
    # binding API
    "propagate", "choose_threshold", "confirm", "coverage_accuracy",
    # propagation and confirmation building blocks
    "propagate_exact", "propagate_mc", "concept_outcomes", "logistic_front_end", "assignments",
    "confirmation_scores", "select_top_per_concept", "select_top_global", "apply_confirmation", "abstain_mask", "confidence",
    # models
    "ConceptMLP", "create_detector", "detector_loss", "make_detector_train_step", "fit_front_end",
    "front_end_loss", "fit_calibration", "calibrated_probs",
    # data
    "ConceptDataset", "ConceptSplit", "make_synthetic", "make_digits_concepts", "digit_concepts",
    "load_concept_dataset",
]
