"""LLMBar: meta-evaluating LLM evaluators on instruction following (Zeng et al., ICLR 2024) in JAX.

OpenReview: https://openreview.net/forum?id=tr0KidwPLc . arXiv: https://arxiv.org/abs/2310.07641 .
Official code and data: https://github.com/princeton-nlp/LLMBar (MIT).

An evaluator is an LLM plus a prompting strategy that says which of two outputs follows an instruction
better. LLMBar's 419 pairs (Natural 100; Adversarial: Neighbor 134, GPTInst 92, GPTOut 47, Manual 46) measure
its accuracy (both presentation orders) and positional agreement. The default judge here is SmolLM2-135M-
Instruct from `iclr24_jax.lm`; any `judge(prompts, max_new_tokens) -> list[str]` works. By default a judge that
can score options (`choice_logprobs`) is read by its order-debiased log-odds of "Output (a)" vs "Output (b)"
(`judge_mode='logprob'`); `judge_mode='generate'` parses its text as the paper does.

  from iclr24_jax.papers import llmbar
  data = llmbar.load(llmbar.default_data_dir())
  judge = llmbar.SmolLMJudge()
  res = llmbar.evaluate(judge, data["Natural"], "rules_metrics_reference")   # judge_mode='auto' -> 'logprob'
  res["accuracy"], res["agreement"], res["preference"]
"""
from iclr24_jax.lm.cache import GenerationCache, cache_key
from iclr24_jax.papers.llmbar.data import (ADVERSARIAL, SUBSETS, Instance, default_data_dir, load,
                                           stratified_subset)
from iclr24_jax.papers.llmbar.evaluator import (STRATEGIES, Strategy, build_aux_prompt, build_prompt, call_choice,
                                                call_judge, evaluate, evaluate_subsets, get_strategy,
                                                synthesis_explanations)
from iclr24_jax.lm.annotate import ConstantJudge, chatml_to_messages
from iclr24_jax.papers.llmbar.model import FakeJudge, SmolLMJudge, logit_bias_for
from iclr24_jax.papers.llmbar.parsing import map_back, parse_answer, parse_rating, swap_output_labels
from iclr24_jax.papers.llmbar.scoring import score, score_subsets

TITLE = "Evaluating Large Language Models at Evaluating Instruction Following"
URL = "https://openreview.net/forum?id=tr0KidwPLc"
ARXIV = "https://arxiv.org/abs/2310.07641"
CODE = "https://github.com/princeton-nlp/LLMBar"
BIBTEX = """@inproceedings{zeng2024llmbar,
  title     = {Evaluating Large Language Models at Evaluating Instruction Following},
  author    = {Zeng, Zhiyuan and Yu, Jiatong and Gao, Tianyu and Meng, Yu and Goyal, Tanya and Chen, Danqi},
  booktitle = {The Twelfth International Conference on Learning Representations (ICLR)},
  year      = {2024},
  url       = {https://openreview.net/forum?id=tr0KidwPLc}
}"""

__all__ = [
    # binding API
    "load", "parse_answer", "score", "build_prompt", "evaluate", "parse_rating",
    # data
    "Instance", "SUBSETS", "ADVERSARIAL", "default_data_dir", "stratified_subset",
    # strategies and prompts
    "STRATEGIES", "Strategy", "get_strategy", "build_aux_prompt", "synthesis_explanations",
    # evaluation
    "evaluate_subsets", "call_judge", "call_choice", "score_subsets", "map_back", "swap_output_labels",
    # judges and caching
    "SmolLMJudge", "FakeJudge", "ConstantJudge", "chatml_to_messages", "logit_bias_for", "GenerationCache",
    "cache_key",
]
