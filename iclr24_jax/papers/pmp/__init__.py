"""PMP: Partitioning Message Passing for Graph Fraud Detection (Zhuo et al., ICLR 2024).

Paper: https://openreview.net/forum?id=tEgrUrUuwA  (arXiv: https://arxiv.org/abs/2412.00020)
Official code: https://github.com/Xtra-Computing/PMP (model/LASAGE_S.py)

    from iclr24_jax.papers import pmp
    out = pmp.partition_messages(graph, h, label_state, params)          # one layer, pure
    model = pmp.PMP(hidden=48)                                            # relations -> logits
    logits = model.apply({'params': p}, [g_rel0, g_rel1, g_rel2], x, label_state)
    pmp.evaluate(scores, labels, mask, threshold) -> dict(auc, f1_macro, gmean)
"""
from iclr24_jax.papers.pmp.data import (GraphData, class_homophily, edge_homophily, label_state_from_split,
                                        load_fraud_mat, load_geom_gcn, make_batch, make_fraud_graph)
from iclr24_jax.papers.pmp.metrics import auc_roc, best_f1_threshold, evaluate, f1_macro, gmean
from iclr24_jax.papers.pmp.model import (GCN, PMP, GCNLayer, GraphSAGE, PMPLayer, RelationalGNN, SAGELayer,
                                         create_model, gcn_messages, partition_messages, sage_messages)
from iclr24_jax.papers.pmp.train import fit, init, init_params, loss_fn, make_predict, make_train_step

TITLE = "Partitioning Message Passing for Graph Fraud Detection"
URL = "https://openreview.net/forum?id=tEgrUrUuwA"
CODE = "https://github.com/Xtra-Computing/PMP"
BIBTEX = """@inproceedings{zhuo2024partitioning,
  title     = {Partitioning Message Passing for Graph Fraud Detection},
  author    = {Zhuo, Wei and Liu, Zemin and Hooi, Bryan and He, Bingsheng and Tan, Guang and Fathony, Rizal and
               Chen, Jia},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://openreview.net/forum?id=tEgrUrUuwA}
}"""

__all__ = [
    "partition_messages", "sage_messages", "gcn_messages", "PMPLayer", "SAGELayer", "GCNLayer", "RelationalGNN",
    "PMP", "GraphSAGE", "GCN", "create_model", "init_params", "init", "loss_fn", "make_train_step",
    "make_predict", "fit", "evaluate", "auc_roc", "f1_macro", "gmean", "best_f1_threshold", "GraphData",
    "make_fraud_graph", "load_fraud_mat", "load_geom_gcn", "label_state_from_split", "class_homophily",
    "edge_homophily", "make_batch", "TITLE", "URL", "CODE", "BIBTEX",
]
