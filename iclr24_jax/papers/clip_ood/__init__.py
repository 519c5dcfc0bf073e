"""Does CLIP's Generalization Performance Mainly Stem from High Train-Test Similarity?

Mayilvahanan, Wiedemer, Rusak, Bethge, Brendel, ICLR 2024. arXiv: https://arxiv.org/abs/2310.09562,
OpenReview: https://openreview.net/forum?id=tnBaiidobu, official code: https://github.com/brendel-group/clip-ood

CLIP is retrained on LAION splits pruned so that no benchmark image (ImageNet-Sketch/-R/-A/-V2/ObjectNet/Val)
is closer to the pruned pool than to its nearest ImageNet-train image; zero-shot accuracy drops on some
benchmarks but stays high overall, so train-test similarity alone does not explain CLIP's robustness. A
100M split of the samples most similar to the benchmarks matches the full data's performance.

    from iclr24_jax.papers import clip_ood
    vals, idx = clip_ood.topk_similarity(queries, keys, k=10, chunk=4096, mesh=mesh)   # [Q, k] each
    keep = clip_ood.deduplicate(emb, num_clusters=100, threshold=0.124, key=key)      # [N] bool
    keep = clip_ood.similarity_prune(pool_emb, imagenet_emb, [sketch_emb, r_emb])    # [N] bool
    keep = clip_ood.similarity_split(pool_emb, [sketch_emb, r_emb], size=n // 2)     # most-similar half
    loss = clip_ood.clip_loss(image_emb, text_emb, logit_scale)                      # symmetric InfoNCE
    acc = clip_ood.zero_shot_accuracy(image_emb, class_template_emb, labels)           # templates averaged
"""
from iclr24_jax.papers.clip_ood.dedup import DEDUP_THRESHOLD, deduplicate, kmeans, within_cluster_duplicates
from iclr24_jax.papers.clip_ood.similarity import (max_margin, max_similarity_to_sets, nearest_similarity,
                                                   similarity_prune, similarity_split, similarity_thresholds,
                                                   topk_similarity)
from iclr24_jax.vision.clip import clip_loss, zero_shot_accuracy, zero_shot_classifier

TITLE = "Does CLIP's Generalization Performance Mainly Stem from High Train-Test Similarity?"
URL = "https://arxiv.org/abs/2310.09562"
OPENREVIEW = "https://openreview.net/forum?id=tnBaiidobu"
CODE = "https://github.com/brendel-group/clip-ood"
BIBTEX = """@inproceedings{mayilvahanan2024does,
  title     = {Does {CLIP}'s Generalization Performance Mainly Stem from High Train-Test Similarity?},
  author    = {Mayilvahanan, Prasanna and Wiedemer, Thadd{\\"a}us and Rusak, Evgenia and Bethge, Matthias and
               Brendel, Wieland},
  booktitle = {The Twelfth International Conference on Learning Representations (ICLR)},
  year      = {2024},
  url       = {https://openreview.net/forum?id=tnBaiidobu}
}"""

__all__ = ["topk_similarity", "nearest_similarity", "max_margin", "similarity_thresholds", "similarity_prune",
           "max_similarity_to_sets", "similarity_split", "deduplicate", "kmeans", "within_cluster_duplicates",
           "DEDUP_THRESHOLD", "clip_loss", "zero_shot_accuracy", "zero_shot_classifier", "TITLE", "URL", "BIBTEX"]
