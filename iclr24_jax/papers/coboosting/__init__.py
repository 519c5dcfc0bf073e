"""coboosting: Enhancing One-Shot Federated Learning Through Data and Ensemble Co-Boosting (Dai et al., ICLR 2024).

arXiv: https://arxiv.org/abs/2402.15070 -- official code: https://github.com/rong-dai/Co-Boosting

Clients are trained once on Dirichlet non-IID partitions and never again. Every server epoch, a freshly
initialised generator synthesises a batch of hard samples for the current weighted ensemble (hardness-weighted
CE plus an adversarial KL against the server), the ensemble weights take a signed-gradient step on the growing
pool of synthetic samples, and the server distils the ensemble on output-diversified perturbations of the pool.

Public API:
  dirichlet_partition                                    (non-IID client partitions)
  ensemble_logits, hard_sample_loss, adversarial_loss, kd_loss   (pure losses)
  update_weights, ods_perturb, synthesis_step, distill_step      (pure steps; callers compile)
  Method, dense_like, knobs, init_synthesis, init, fit           (a whole server training)
  Generator, ClientSet, train_clients, fedavg_params             (models and clients)
  run (experiment.run(config, workdir)); the study (reproduce, benchmark) is in study.py
"""
from iclr24_jax.papers.coboosting.clients import train_clients
from iclr24_jax.papers.coboosting.coboost import (Method, SynthState, dense_like, distill_step, fit,
                                                  hard_sample_synthesis, init, init_synthesis, knobs,
                                                  ods_perturb, synthesis_step, teacher_logits, update_weights,
                                                  weight_step)
from iclr24_jax.papers.coboosting.losses import (adversarial_loss, ensemble_logits, hard_sample_loss, kd_loss,
                                                 kl_divergence)
from iclr24_jax.papers.coboosting.model import ClientSet, Generator, fedavg_params, stack_params
from iclr24_jax.papers.coboosting.partition import dirichlet_partition, mean_label_entropy


def run(config, workdir=None):
  """`experiment.run(config, workdir)`: one one-shot FL experiment (see configs/coboosting.py)."""
  from iclr24_jax.papers.coboosting import experiment
  return experiment.run(config, workdir)


TITLE = "Enhancing One-Shot Federated Learning Through Data and Ensemble Co-Boosting"
URL = "https://arxiv.org/abs/2402.15070"
BIBTEX = """@inproceedings{dai2024coboosting,
  title={Enhancing One-Shot Federated Learning Through Data and Ensemble Co-Boosting},
  author={Dai, Rong and Zhang, Yonggang and Li, Ang and Liu, Tongliang and Yang, Xun and Han, Bo},
  booktitle={The Twelfth International Conference on Learning Representations},
  year={2024},
  url={https://arxiv.org/abs/2402.15070}
}"""

__all__ = ["dirichlet_partition", "mean_label_entropy", "ensemble_logits", "hard_sample_loss", "adversarial_loss",
           "kd_loss", "kl_divergence", "update_weights", "weight_step", "ods_perturb", "synthesis_step",
           "distill_step", "hard_sample_synthesis", "teacher_logits", "Method", "SynthState", "dense_like", "knobs",
           "init_synthesis", "init", "fit", "Generator", "ClientSet", "stack_params", "fedavg_params",
           "train_clients", "run", "TITLE", "URL", "BIBTEX"]
