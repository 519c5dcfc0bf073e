"""MDM: Matryoshka Diffusion Models (Gu, Zhai, Zhang, Susskind, Jaitly; ICLR 2024).

Paper: https://arxiv.org/abs/2310.15111 (ICLR 2024)
Official code: https://github.com/apple/ml-mdm (ml_mdm/models/nested_unet.py, diffusion.py, samplers.py)

    from iclr24_jax.papers import mdm
    xs = mdm.pyramid(x, num_levels=2, factor=4)                       # [B,32,32,1] -> [x32, x8]
    scheds = mdm.level_schedules(diffusion.squaredcos_cap_v2(1000), 2, 4, power=1)
    model = mdm.make_model([outer_cfg, inner_cfg], num_classes=10)     # a NestedUNet (outer 32 -> inner 8)
    loss, aux = mdm.loss_fn(params, {'x': x, 'y': y}, key, model=model, schedules=scheds)
    params = mdm.load_inner(params, inner_params)                      # progressive training
    x32, x8 = mdm.sample(key, params, model=model, schedules=scheds, image_shape=(32, 32, 1), labels=y,
                         guidance_scale=2.0)
"""
from iclr24_jax.papers.mdm.model import (NestAdapter, NestedUNet, apply_model, inner_model, level_ratios,
                                         level_schedules, load_inner, make_model, num_levels, pyramid,
                                         shifted_log_snr)
from iclr24_jax.papers.mdm.train import (consistency, init_params, level_factors, level_shapes, loss_fn,
                                         make_train_step, model_pyramid, null_label, sample)

TITLE = "Matryoshka Diffusion Models"
URL = "https://arxiv.org/abs/2310.15111"
CODE = "https://github.com/apple/ml-mdm"
BIBTEX = """@inproceedings{gu2024matryoshka,
  title     = {Matryoshka Diffusion Models},
  author    = {Gu, Jiatao and Zhai, Shuangfei and Zhang, Yizhe and Susskind, Joshua M. and Jaitly, Navdeep},
  booktitle = {The Twelfth International Conference on Learning Representations},
  year      = {2024},
  url       = {https://arxiv.org/abs/2310.15111}
}"""

__all__ = [
    "pyramid", "shifted_log_snr", "level_ratios", "level_schedules", "NestedUNet", "NestAdapter", "make_model",
    "inner_model", "num_levels", "apply_model", "load_inner", "loss_fn", "make_train_step", "init_params", "sample",
    "consistency", "level_factors", "level_shapes", "model_pyramid", "null_label",
    "TITLE", "URL", "CODE", "BIBTEX",
]
