"""Dissecting learning and forgetting in language model finetuning (Zhang & Wu, ICLR 2024).

Paper: https://openreview.net/forum?id=tmsqb6WpLz
Official code: https://github.com/xiaozeroone/lm_finetune_dissect (finetuning only; the analysis is in the paper)

    from iclr24_jax.papers import finetune_dissect as fd
    delta = fd.token_logprob_change(base_params, ft_params, config, ids, mask)       # [B, T], Eq. (1)
    parts = fd.decompose({'original': d0, 'topic': d1, 'style': d2, 'counterfactual': d3}, masks)
    parts['topic'], parts['style'], parts['factual'], parts['by_position']['topic']  # Eqs. (3)-(6)
    probes = fd.make_probe_set(documents, rewriter)      # {'original', 'topic', 'style', 'counterfactual'}
"""
from iclr24_jax.papers.finetune_dissect.dissect import (VERSIONS, by_position, decompose, early_share, half_time,
                                                        per_document, token_logprob_change)
from iclr24_jax.papers.finetune_dissect.grammar import (GrammarParams, GrammarSpec, analytic_token_logprobs,
                                                        fact_tables, general_params, probe_versions,
                                                        sample_documents)
from iclr24_jax.papers.finetune_dissect.probes import (FILTER_RULES, REWRITE_PROMPTS, cached_rewriter, clean_rewrite,
                                                       filter_probes, make_probe_set)
from iclr24_jax.papers.finetune_dissect.finetune import (make_finetune, make_pretrain, make_probes,
                                                         synthetic_study)

TITLE = "Dissecting learning and forgetting in language model finetuning"
URL = "https://openreview.net/forum?id=tmsqb6WpLz"
CODE = "https://github.com/xiaozeroone/lm_finetune_dissect"
BIBTEX = """@inproceedings{zhang2024dissecting,
  title     = {Dissecting learning and forgetting in language model finetuning},
  author    = {Zhang, Xiao and Wu, Ji},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://openreview.net/forum?id=tmsqb6WpLz}
}"""

__all__ = [
    "token_logprob_change", "decompose", "make_probe_set", "VERSIONS", "per_document", "by_position",
    "early_share", "half_time", "GrammarSpec", "GrammarParams", "analytic_token_logprobs", "fact_tables",
    "general_params", "sample_documents", "probe_versions", "REWRITE_PROMPTS", "FILTER_RULES", "clean_rewrite",
    "cached_rewriter", "filter_probes", "make_pretrain", "make_finetune", "make_probes", "synthetic_study",
    "TITLE", "URL", "CODE", "BIBTEX",
]
