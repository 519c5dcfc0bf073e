"""Dissecting learning and forgetting in language model finetuning (Zhang & Wu, ICLR 2024).

Paper: https://openreview.net/forum?id=tmsqb6WpLz   Official code: https://github.com/xiaozeroone/lm_finetune_dissect

Run:  python -m experiments.main --config=configs/finetune_dissect.py:tiny --workdir=runs/finetune_dissect_tiny
      python -m experiments.main --config=configs/finetune_dissect.py --workdir=runs/finetune_dissect
Variants: '' (the synthetic grammar study: a tiny Llama pretrained on the general mix, finetuned on the domain mix,
full and LoRA rank 1 and 8, 3 seeds), 'tiny' (seconds on CPU) and 'paper' (the official run: Llama-2-7B finetuned on
PubMed, compiled ahead of time by `python -m experiments.scale --only finetune_dissect`).
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("", "tiny", "paper")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The finetune_dissect config: the synthetic grammar study (tiny Llama, full / LoRA rank 1 and 8, 3 seeds).

  Args:
    arg: '' (the study), 'tiny' (seconds on CPU) or 'paper' (the official Llama-2-7B run's sizes); None means ''.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  c = ml_collections.ConfigDict()
  c.paper = "finetune_dissect"
  c.seed = 0
  c.num_seeds = 3
  # The grammar (iclr24_jax/papers/finetune_dissect/grammar.py): sizes of its topic, style and fact variables.
  # Deviation: a synthetic grammar with a known decomposition stands in for PubMed; the domain mix puts 0.8 (not
  # 1.0) of its documents on the domain topic and style, so the base model has seen both.
  c.data = ml_collections.ConfigDict(dict(
      name="grammar", data_dir="", num_topics=4, topic_vocab=8, num_styles=3, style_vocab=4,
      num_general_subjects=64, num_domain_subjects=512, num_values=16, num_sentences=4,
      domain_topic_prob=0.8, domain_style_prob=0.8, num_probe_documents=64, num_fit_documents=512))
  # num_sentences=4: the first 25% of the 20 scored positions is exactly the first sentence (one token of each
  # slot), so a component spread evenly over the text has an early share of 0.25 whatever its slot.
  # num_fit_documents: fresh general-mix documents on which the pretrained base is checked against the grammar's
  # entropy (finetune.base_fit).
  # 8 heads of width 8, no key/value sharing (see the pretraining note below).
  c.model = ml_collections.ConfigDict(dict(hidden_size=64, num_layers=2, num_heads=8, num_kv_heads=8,
                                           intermediate_size=128))
  # Pretraining until the base models the grammar (loss within 0.05 nats/token of its entropy, later topic words at
  # ln 8; study.base_fit_row checks it on every seed): with these settings 6 of 6 seeds measured got there by step
  # ~450 of 1000. What it took, measured by changing one setting back at a time: documents of 8 sentences
  # (num_sentences; with the study's 4, 3 of 6 seeds learned to read only one of topic and style, or neither), 8
  # heads (with 4 query / 2 key-value heads, 1 of 6 seeds read only the style), and init_scale 4 on the layer kernels
  # (std 0.08 instead of the library's 0.02, GPT-2's value for width 768; 0.02 * sqrt(768 / 64) = 0.07 at width
  # 64; with 0.02 and 4 / 2 heads, 1 of 3 seeds stayed on the plateau for 3,000 steps, every topic word at ln 32).
  # The former setting (600 steps, 4 sentences, 4 / 2 heads, std 0.02) left the bases at 2.84-3.0 nats/token.
  # Deviation: the paper finetunes pretrained LMs; this base is pretrained here, on longer documents than the study
  # probes (finetuning and the probes keep num_sentences = 4).
  c.pretrain = ml_collections.ConfigDict(dict(steps=1000, batch_size=32, learning_rate=3e-3, num_sentences=8,
                                              init_scale=4.0))
  # Official trainer (config/train_*.yaml): AdamW, warmup_ratio 0.1, linear schedule, grad clip 1.0, batch 8, one
  # learning rate for full and LoRA (3e-6 for Llama-2-7B; ours is sized for a 100k-parameter model).
  # Deviation: learning rate 1e-3 and batch 32 (official 3e-6, batch 8) for the tiny Llama on a CPU budget.
  c.optimizer = ml_collections.ConfigDict(dict(name="adamw", learning_rate=1e-3, warmup_frac=0.1, grad_clip=1.0,
                                               batch_size=32))
  c.num_steps = 300          # finetuning steps
  c.eval_every = 20          # probe versions scored every N finetuning steps
  c.methods = ("full", "lora1", "lora8")   # 'full' or 'lora<rank>'
  c.lora = ml_collections.ConfigDict(dict(alpha_over_rank=2.0,   # official r 8, alpha 16
                                          targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                   "up_proj", "down_proj")))
  c.log_every = 20
  # Saves of the stages 'pretrain' and 'finetune_<method>' (experiment.run): every N optimizer steps of each stage (a
  # multiple of log_every and eval_every: saves happen at chunk boundaries), and every N wall seconds.
  c.checkpoint_every = 200
  c.checkpoint_every_secs = 600.0
  c.mesh = ml_collections.ConfigDict(dict(data=1, model=1))

  arg = variants.one(arg, VARIANTS, name="finetune_dissect")
  if arg == "tiny":
    c.num_seeds = 2
    # A small grammar that a 1-layer, 4-head Llama learns to read from the context in 600 steps (seconds), so
    # the tiny run's base is checked against the grammar's entropy like the study's (tests/papers/...).
    c.data.num_topics, c.data.topic_vocab, c.data.num_styles, c.data.style_vocab = 3, 4, 2, 3
    c.data.num_domain_subjects = 16
    c.data.num_general_subjects = 8
    c.data.num_values = 4
    c.data.num_probe_documents = 8
    c.data.num_sentences = 3
    c.data.num_fit_documents = 256
    c.model = ml_collections.ConfigDict(dict(hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=4,
                                             intermediate_size=64))
    c.pretrain = ml_collections.ConfigDict(dict(steps=600, batch_size=16, learning_rate=1e-2, num_sentences=6,
                                                init_scale=4.0))
    c.optimizer.batch_size = 8
    c.num_steps = 20
    c.eval_every = 10
    c.log_every = 10
    c.methods = ("full", "lora2")
  elif arg == "paper":
    # The official run, xiaozeroone/lm_finetune_dissect@35122b8: config/train_full.yaml, config/deepspeed.yaml,
    # run.py (and config/train_lora.yaml for LoRA).
    c.num_seeds = 1
    c.seed = 1                                              # train_full.yaml:22
    c.data = ml_collections.ConfigDict(dict(
        name="pubmed", data_dir="",                         # train_full.yaml:2-3 (abstracts, train split)
        max_tokens=1024, num_examples=1000))                # train_full.yaml:4-5 (truncation, subset_examples)
    c.model = ml_collections.ConfigDict(dict(name="llama2_7b"))   # train_full.yaml:8 meta-llama/Llama-2-7b-hf
    # train_full.yaml:11-17: batch_size 8 per device x 8 processes (deepspeed.yaml:14) = 64 sequences per step, lr
    # 3e-6, warmup_ratio 0.1, linear schedule, clip 1.0; run.py:64 adamw_torch (Trainer's weight decay 0).
    c.optimizer = ml_collections.ConfigDict(dict(name="adamw", learning_rate=3e-6, warmup_frac=0.1, grad_clip=1.0,
                                                 batch_size=64, weight_decay=0.0))
    c.num_steps = 16                 # one epoch (train_full.yaml:13) over 1,000 abstracts at 64 per step
    c.methods = ("full", "lora8")    # train_full.yaml / train_lora.yaml:9-21 (r 8, alpha 16, the 7 projections)
    c.lora.alpha_over_rank = 2.0
    c.eval_every = 0
    c.log_every = 1
    c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
    # What experiments.scale compiles: the full-finetuning step. run.py:17 loads bfloat16 weights and :29/:63 turn
    # on gradient checkpointing; deepspeed.yaml:5/:12 ZeRO stage 2 with bf16 mixed precision (float32 master
    # weights and Adam moments partitioned over the 8 GPUs). Here: float32 master weights and moments, a bfloat16
    # copy for the forward/backward, every layer rematerialised, everything sharded over 'data' (FSDP, which
    # also shards what ZeRO-2 keeps whole: the bf16 weights and the gradients).
    c.scale = ml_collections.ConfigDict(dict(
        method="full", batch_size=64, seq_len=1024, param_dtype="float32", compute_dtype="bfloat16", remat="full",
        paper_hardware="8x A100 80GB (readme.md:9-11)", paper_time="not stated in the official code",
        source="xiaozeroone/lm_finetune_dissect@35122b8 config/train_full.yaml:2-22, config/deepspeed.yaml:5-14, "
               "run.py:17,29,64"))
  return c
