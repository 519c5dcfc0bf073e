"""nci: Learning Conditional Invariances through Non-Commutativity (Chaudhuri, Georgescu, Dutta; ICLR 2024).

OpenReview: https://openreview.net/forum?id=tUVG9nGzgE  -- official code: https://github.com/abhrac/nci

A discriminator D with K + 1 outputs (0 = target domain, 1..K = source domains) learns to tell domains
apart from frozen features; the featurizer is then trained so that *source* features look like the
target to D. The alignment is one-directional (non-commutative): target features never receive an
adversarial gradient, unlike DANN, where both sides are pulled together.

Public API:
  discriminator_loss, loss_fn, erm_model_loss, dann_model_loss      (pure losses)
  init, train_step, erm_step, dann_step, make_train_step             (state and steps)
  evaluate, make_domains, split_pool                                 (evaluation and data)
  train.pretrain, train.leave_one_out(init_params=...)               (the pretrained setting, study.py)
"""
from iclr24_jax.papers.nci.data import DOMAINS, Domain, make_domains, split_pool
from iclr24_jax.papers.nci.losses import dann_model_loss, discriminator_loss, erm_model_loss, loss_fn
from iclr24_jax.papers.nci.model import AdversarialState, Networks, init
from iclr24_jax.papers.nci.train import dann_step, erm_step, evaluate, make_train_step, train_step

TITLE = "Learning Conditional Invariances through Non-Commutativity"
URL = "https://openreview.net/forum?id=tUVG9nGzgE"
BIBTEX = """@inproceedings{chaudhuri2024nci,
  title={Learning Conditional Invariances through Non-Commutativity},
  author={Chaudhuri, Abhra and Georgescu, Serban and Dutta, Anjan},
  booktitle={The Twelfth International Conference on Learning Representations},
  year={2024},
  url={https://openreview.net/forum?id=tUVG9nGzgE}
}"""

__all__ = ["discriminator_loss", "loss_fn", "erm_model_loss", "dann_model_loss", "init", "train_step",
           "erm_step", "dann_step", "make_train_step", "evaluate", "make_domains", "split_pool", "Domain", "DOMAINS",
           "AdversarialState", "Networks", "TITLE", "URL", "BIBTEX"]
