"""LLMBar prompts (`papers/llmbar/prompts.py`): the templates equal the official prompt files."""
import hashlib

from iclr24_jax.papers.llmbar import prompts


# SHA-256 (first 16 hex) of each template; equal to the official princeton-nlp/LLMBar prompt files @ caa7bee
# (checked character for character when the templates were written). Guards the wording, which is the method.
TEMPLATE_DIGESTS = {
    "vanilla": "c5759aaedc9df7d9", "rules": "77a3a8f354472bc3", "rules_metrics": "75b5fd4c8b24bbb1",
    "rules_reference": "5e0f2645cd41c94a", "rules_metrics_reference": "a75730d4a3e76bab", "cot": "fe8768534e491481",
    "aux_metrics": "582d0cdf593c47fd", "aux_reference": "8403681024047a91", "swap_synthesize": "cefbd81e8adfd6f5",
    "swap_cot_synthesize": "4f74f144f3dcc670", "rating_norules": "4ee7762365503ced", "rating": "4c1fbf0c857ea706",
    "rating_metrics": "8b6133dac7908fca", "rating_reference": "ba2029222833f32b",
    "rating_metrics_reference": "90630ec0ef0a7992",
}


def test_templates_match_official_files():
  assert set(prompts.TEMPLATES) == set(TEMPLATE_DIGESTS)
  for k, v in prompts.TEMPLATES.items():
    assert hashlib.sha256(v.encode()).hexdigest()[:16] == TEMPLATE_DIGESTS[k], k
