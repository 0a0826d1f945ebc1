"""Standard CIFAR data augmentation as pure JAX functions on one batch.

Random crop after zero padding plus a random horizontal flip, as in
He et al. (2016, section 4.2) and most decentralized-learning CIFAR recipes.
The functions act on one node's batch ``[B, H, W, C]``; for stacked node
batches ``[N, B, H, W, C]`` vmap them with one key per node::

    keys = jax.random.split(key, num_nodes)
    x = jax.vmap(augment_cifar)(keys, x)

Zero padding happens in whatever space the images are in: on images
standardized by :func:`jaxgossip.data.load_dataset` it pads with the mean
colour (as the flax/JAX CIFAR examples do).

References:
    K. He, X. Zhang, S. Ren, J. Sun. Deep residual learning for image
    recognition. CVPR 2016, arXiv:1512.03385.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def random_crop(key: jax.Array, images: jax.Array, padding: int = 4) -> jax.Array:
    """Pads each image with ``padding`` zeros per side, then crops a random H x W window.

    Args:
        key: PRNG key.
        images: [B, H, W, C].
        padding: pixels of zero padding per side (static).

    Returns:
        [B, H, W, C]; image b is ``pad(images[b])[dy:dy+H, dx:dx+W]`` with
        ``dy, dx`` uniform in ``[0, 2 * padding]``.
    """
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    batch, height, width, channels = images.shape
    padded = jnp.pad(images, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
    offsets = jax.random.randint(key, (batch, 2), 0, 2 * padding + 1)

    def crop(image, offset):
        return jax.lax.dynamic_slice(image, (offset[0], offset[1], 0), (height, width, channels))

    return jax.vmap(crop)(padded, offsets)


def random_flip(key: jax.Array, images: jax.Array) -> jax.Array:
    """Flips each image left-right with probability 1/2.

    Args:
        key: PRNG key.
        images: [B, H, W, C].

    Returns:
        [B, H, W, C].
    """
    flip = jax.random.bernoulli(key, 0.5, (images.shape[0],))
    return jnp.where(flip[:, None, None, None], images[:, :, ::-1, :], images)


def augment_cifar(key: jax.Array, images: jax.Array, *, padding: int = 4, flip: bool = True) -> jax.Array:
    """Standard CIFAR augmentation: random crop with zero padding, then random horizontal flip.

    Args:
        key: PRNG key.
        images: [B, H, W, C].
        padding: zero padding per side before cropping (4 for CIFAR).
        flip: also apply a random horizontal flip.

    Returns:
        Augmented images [B, H, W, C], same dtype.
    """
    key_crop, key_flip = jax.random.split(key)
    images = random_crop(key_crop, images, padding)
    if flip:
        images = random_flip(key_flip, images)
    return images
