"""Vision family: small MLP / CNN / ResNet classifiers (Flax Linen), the supervised classifier and a digits judge.

The whole library uses Flax Linen: modules are stateless descriptions, parameters are plain pytrees,
and `model.apply(params, x)` is a pure function that composes with jit, vmap, grad and sharding.
"""
from iclr24_jax.vision import clip, judge
from iclr24_jax.vision.models import CNN, MLP, MNISTCNN, CNNCifar, InceptionV3, ResNet, create_model

__all__ = ["clip", "judge", "MLP", "CNN", "MNISTCNN", "CNNCifar", "InceptionV3", "ResNet", "create_model"]
