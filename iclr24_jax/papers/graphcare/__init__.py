"""GraphCare: Enhancing Healthcare Predictions with Personalized Knowledge Graphs (Jiang et al., ICLR 2024).

Paper: https://openreview.net/forum?id=tVTN7Zs0ml  (arXiv: https://arxiv.org/abs/2305.12788)
Official code: https://github.com/pat-jj/GraphCare (graphcare_/model.py: BiAttentionGNNConv, GraphCare)

    from iclr24_jax.papers import graphcare
    ckg = graphcare.cluster_kg(raw_kg, entity_emb, relation_emb, threshold=0.15)   # node/edge merging
    graph, visit_node = graphcare.build_patient_graphs(visits, ckg)                  # padded jraph batch
    model = graphcare.BAT(num_nodes=ckg.num_nodes, num_relations=ckg.num_relations, out_dim=1)
    state, metrics = graphcare.train_step(state, batch, key, model=model, task="binary")
    graphcare.evaluate(model, state.params, batches, "binary") -> dict(auroc, auprc, f1, jaccard, ...)
    graphcare.propose_triples(generate_fn, concept_names)   # the pluggable LLM step (any text generator)
"""
from iclr24_jax.papers.graphcare.data import (EHRDataset, SyntheticEHR, categorize_los, kfold_by_patient,
                                              make_synthetic_ehr, mimic3_demo_task, mimic_concept_kg,
                                              read_mimic3_demo, split_by_patient)
from iclr24_jax.papers.graphcare.graphs import (Batcher, Budgets, PatientGraph, budgets_for, build_patient_graphs,
                                                collate, dense_visit_node_matrix, global_triples, patient_graph)
from iclr24_jax.papers.graphcare.kg import (ConceptKG, RawKG, agglomerative_labels, cluster_kg, embed_kg_names,
                                            fixed_kg_example, kg_from_triples, minilm_embed, parse_triples,
                                            propose_triples, smollm2_generate_fn, tfidf_embed)
from iclr24_jax.papers.graphcare.metrics import (binary_metrics, bootstrap_ci, multiclass_metrics,
                                                 multilabel_metrics, task_metrics)
from iclr24_jax.papers.graphcare.model import (BAT, EHRGRU, GATConv, all_pairs, bat_aggregate, bi_attention,
                                               create_model, decay_weights)
from iclr24_jax.papers.graphcare.train import (SeedStates, apply_batch, collect_seed_predictions, evaluate, fit,
                                               fit_seeds, init, loss_fn, make_seeds_train_step,
                                               make_train_step, predict_step, task_loss, train_step)

TITLE = "GraphCare: Enhancing Healthcare Predictions with Personalized Knowledge Graphs"
URL = "https://openreview.net/forum?id=tVTN7Zs0ml"
CODE = "https://github.com/pat-jj/GraphCare"
BIBTEX = """@inproceedings{jiang2024graphcare,
  title     = {GraphCare: Enhancing Healthcare Predictions with Personalized Knowledge Graphs},
  author    = {Jiang, Pengcheng and Xiao, Cao and Cross, Adam Richard and Sun, Jimeng},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://openreview.net/forum?id=tVTN7Zs0ml}
}"""

__all__ = [
    # binding API
    "build_patient_graphs", "BAT", "train_step", "evaluate",
    # KG construction and the LLM hook
    "RawKG", "ConceptKG", "cluster_kg", "agglomerative_labels", "embed_kg_names", "tfidf_embed", "propose_triples",
    "smollm2_generate_fn", "minilm_embed", "parse_triples", "kg_from_triples", "fixed_kg_example",
    # patient graphs and batches
    "PatientGraph", "Budgets", "patient_graph", "global_triples", "budgets_for", "collate", "Batcher",
    "dense_visit_node_matrix",
    # model, losses, training
    "bi_attention", "all_pairs", "bat_aggregate", "decay_weights", "GATConv", "EHRGRU", "create_model",
    "init", "loss_fn", "task_loss",
    "make_train_step", "predict_step", "apply_batch", "fit", "fit_seeds", "make_seeds_train_step", "SeedStates",
    "collect_seed_predictions",
    # metrics
    "task_metrics", "binary_metrics", "multiclass_metrics", "multilabel_metrics", "bootstrap_ci",
    # data
    "EHRDataset", "SyntheticEHR", "make_synthetic_ehr", "read_mimic3_demo", "mimic3_demo_task", "mimic_concept_kg",
    "categorize_los", "split_by_patient", "kfold_by_patient",
    "TITLE", "URL", "CODE", "BIBTEX",
]
