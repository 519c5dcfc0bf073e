"""D2 Pruning: Message Passing for Balancing Diversity and Difficulty in Data Pruning.

Maharana, Yadav, Bansal, ICLR 2024. arXiv: https://arxiv.org/abs/2310.07931,
ICLR page: https://iclr.cc/virtual/2024/poster/17608, official code: https://github.com/adymaharana/d2pruning

Coreset selection on a kNN graph of the training set: forward message passing spreads difficulty scores
(from training dynamics) to neighbours, then a greedy loop picks the highest-scoring example and lowers
its neighbours' scores (reverse message passing), so the coreset is both difficult and diverse.

    from iclr24_jax.papers import d2pruning
    graph = d2pruning.knn_graph(embeddings, k=10)                       # GraphsTuple, distances on edges
    rho = d2pruning.forward_message_passing(graph, scores, gamma=1.0)   # [N]
    idx = d2pruning.reverse_message_passing_select(graph, rho, budget=500, gamma=0.1)  # [500] int32
    idx = d2pruning.select_coreset(embeddings, scores, 0.3, method='d2', labels=labels, hard_cutoff=0.1,
                                   cutoff_scores=max_aum - aum)         # also 'random', 'difficulty', 'ccs', 'kcenter'
"""
from iclr24_jax.papers.d2pruning.dataset_graph import knn_graph, max_degree, neighbour_table
from iclr24_jax.papers.d2pruning.message_passing import (forward_message_passing, neighbour_lists,
                                                         reverse_message_passing_select, select_from_lists,
                                                         select_from_table)
from iclr24_jax.papers.d2pruning.scores import (as_difficulty, example_stats, make_dynamics_trainer,
                                                scores_from_dynamics)
from iclr24_jax.papers.d2pruning.selection import (METHODS, bin_allocate, hard_cutoff_mask, kcenter_greedy,
                                                   score_strata, select_coreset)

TITLE = "D2 Pruning: Message Passing for Balancing Diversity and Difficulty in Data Pruning"
URL = "https://arxiv.org/abs/2310.07931"
ICLR_PAGE = "https://iclr.cc/virtual/2024/poster/17608"
CODE = "https://github.com/adymaharana/d2pruning"
BIBTEX = """@inproceedings{maharana2024d2pruning,
  title     = {{D2} Pruning: Message Passing for Balancing Diversity and Difficulty in Data Pruning},
  author    = {Maharana, Adyasha and Yadav, Prateek and Bansal, Mohit},
  booktitle = {The Twelfth International Conference on Learning Representations (ICLR)},
  year      = {2024},
  url       = {https://arxiv.org/abs/2310.07931}
}"""

__all__ = ["knn_graph", "forward_message_passing", "reverse_message_passing_select", "select_coreset",
           "select_from_table", "select_from_lists", "neighbour_lists", "neighbour_table", "max_degree", "kcenter_greedy", "bin_allocate",
           "hard_cutoff_mask", "score_strata", "METHODS", "example_stats", "make_dynamics_trainer",
           "scores_from_dynamics", "as_difficulty", "TITLE", "URL", "BIBTEX"]
