"""Vision family: small MLP / CNN / ResNet classifiers (Flax Linen) and the supervised classifier.

The whole library uses Flax Linen: modules are stateless descriptions, parameters are plain pytrees,
and `model.apply(params, x)` is a pure function that composes with jit, vmap, grad and sharding.
"""
from iclr24_jax.vision import clip
from iclr24_jax.vision.models import CNN, MLP, MNISTCNN, CNNCifar, InceptionV3, ResNet, create_model

__all__ = ["clip", "MLP", "CNN", "MNISTCNN", "CNNCifar", "InceptionV3", "ResNet", "create_model"]
