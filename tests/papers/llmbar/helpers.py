"""Instances and oracle judges shared by the LLMBar test modules."""
import functools

from iclr24_jax.papers import llmbar


GOOD, BAD = "GOOD answer that follows the instruction", "bad answer"
_gen_eval = functools.partial(llmbar.evaluate, judge_mode="generate")  # the paper's protocol: parsed text


def _inst(label: int, i: int = 0, subset: str = "Natural") -> llmbar.Instance:
  o1, o2 = (GOOD, BAD) if label == 1 else (BAD, GOOD)
  return llmbar.Instance(input=f"Do task number {i}.", output_1=o1 + f" #{i}", output_2=o2 + f" #{i}", label=label,
                         subset=subset, index=i)


INST = llmbar.Instance(input="INSTR_X {output_2}", output_1="OUT_ONE", output_2="OUT_TWO", label=1)
