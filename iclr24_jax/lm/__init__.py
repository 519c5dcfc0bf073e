"""Language-model family: tokenizers, decoder-only and encoder-decoder LMs, offline pretrained weights,
scoring, generation, LoRA and finetuning, and a sentence embedder.

Models are pure functions of parameter pytrees (nested dicts of arrays with Flax-style names), so they
compose with jit, grad, vmap, optax, orbax and mesh sharding without wrappers. See README.md.

  from iclr24_jax import lm
  params, config, tok = lm.load_smollm2()                       # SmolLM2-135M-Instruct, offline
  gen = lm.Generator(params, config, tok)                      # text in, text out (chat template)
  gen(["What is the capital of France?"], max_new_tokens=16)   # ['The capital of France is Paris.']
  ids, mask = tok.encode_batch(["Hello world"])
  lp = lm.token_logprobs(params, config, ids, mask)            # [B, T]
  emb = lm.embed_sentences(*lm.load_minilm(), ["a sentence"])  # [N, 384], unit norm
"""
from iclr24_jax.lm import bert, generation, layers, llama, lora, quant, scoring, t5, tokenizer, train, weights
from iclr24_jax.lm.bert import BertConfig, embed_sentences, find_minilm, load_minilm, sentence_embedding
from iclr24_jax.lm.generation import GenerationOutput, Generator, bias_vector, generate, sample_token
from iclr24_jax.lm.llama import (KVCache, LlamaConfig, forward, fuse_params, gpt2_config, hidden_states,
                                 init_cache, init_params, smollm2_135m_config, tiny_config)
from iclr24_jax.lm.lora import LoraConfig
from iclr24_jax.lm.quant import WEIGHT_FORMATS, convert_params
from iclr24_jax.lm.scoring import (encode_pairs, next_token_logprobs, score_continuations, sequence_logprob,
                                   token_logprobs)
from iclr24_jax.lm.t5 import T5Config
from iclr24_jax.lm.tokenizer import (Tokenizer, from_gguf_metadata, from_tokenizer_json, gpt2_tokenizer,
                                     pad_sequences, train_bpe)
from iclr24_jax.lm.train import causal_lm_loss, init_train_state, make_eval_step, make_train_step
from iclr24_jax.lm.weights import (find_smollm2_gguf, load_gguf_llama, load_hf_gpt2, load_safetensors_llama,
                                   load_smollm2, load_smollm2_tokenizer, save_safetensors_llama)


def chat_prompt(tok: Tokenizer, messages, add_generation_prompt: bool = True, system: str | None = None) -> str:
  """Renders a conversation (list of {'role', 'content'} dicts, or one user message str) with the
  tokenizer's chat template (SmolLM2: ChatML with its default system prompt).

  Args:
    tok: the Tokenizer whose chat template is used.
    messages: list of {'role': 'system' | 'user' | 'assistant', 'content': str}, or one user message str.
    add_generation_prompt: end with the assistant header so the model answers next.
    system: system prompt (None: the template's default).

  Returns:
    the prompt text (str, not token ids).
  """
  return tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, system=system)


__all__ = [
    # modules
    "bert", "generation", "layers", "llama", "lora", "quant", "scoring", "t5", "tokenizer", "train", "weights",
    # pretrained, offline
    "load_smollm2", "load_smollm2_tokenizer", "find_smollm2_gguf", "load_gguf_llama", "load_safetensors_llama",
    "save_safetensors_llama", "load_hf_gpt2", "load_minilm", "find_minilm",
    # decoder-only LM
    "LlamaConfig", "smollm2_135m_config", "tiny_config", "gpt2_config", "init_params", "forward",
    "hidden_states", "fuse_params", "KVCache", "init_cache", "convert_params", "WEIGHT_FORMATS",
    # tokenizers
    "Tokenizer", "from_gguf_metadata", "from_tokenizer_json", "gpt2_tokenizer", "train_bpe", "pad_sequences",
    "chat_prompt",
    # scoring and generation
    "token_logprobs", "sequence_logprob", "next_token_logprobs", "encode_pairs", "score_continuations",
    "generate", "GenerationOutput", "Generator", "sample_token", "bias_vector",
    # finetuning
    "LoraConfig", "causal_lm_loss", "init_train_state", "make_train_step", "make_eval_step",
    # other models
    "T5Config", "BertConfig", "sentence_embedding", "embed_sentences",
]

# The annotator kit shared by the papers that judge or annotate with a small local LM (llmbar, cpm, motif, mario,
# finetune_dissect): option log-probabilities with one prefill, order-debiased preferences, judges,
# the resumable generation/score cache.
from iclr24_jax.lm import annotate, cache  # noqa: E402
from iclr24_jax.lm.annotate import ConstantJudge, FakeJudge, SmolLMJudge, chatml_to_messages  # noqa: E402
from iclr24_jax.lm.cache import GenerationCache, cache_key, cached_map  # noqa: E402
from iclr24_jax.lm.scoring import choice_logprobs, debiased_preference, score_suffixes  # noqa: E402

__all__ += [
    "annotate", "cache", "choice_logprobs", "debiased_preference", "score_suffixes", "SmolLMJudge", "FakeJudge",
    "ConstantJudge", "chatml_to_messages", "GenerationCache", "cache_key", "cached_map",
]

# KL to a frozen reference (mario's Quark objective) and T5 with embeddings / prefixes (lm_inversion's inverter).
from iclr24_jax.lm.generation import nucleus_mask  # noqa: E402
from iclr24_jax.lm.train import default_loss, kl_regularized_loss, target_logits, token_kl  # noqa: E402

__all__ += ["kl_regularized_loss", "token_kl", "target_logits", "default_loss", "nucleus_mask"]

# Paper scale: the released Llama-2 shapes, stacked (scanned) layers, and the programs `experiments.scale` compiles.
from iclr24_jax.lm import scale  # noqa: E402
from iclr24_jax.lm.llama import llama2_config, stack_layers, unstack_layers  # noqa: E402

__all__ += ["scale", "llama2_config", "stack_layers", "unstack_layers"]
