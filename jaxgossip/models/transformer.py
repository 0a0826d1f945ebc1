"""A decoder-only (GPT-style) transformer language model with pre-norm blocks.

tokens [B, T] -> embedding [B, T, W] (+ learned positions) -> depth x block -> LayerNorm -> logits
[B, T, V], where a block is

.. math::
    h \\leftarrow h + \\mathrm{Attn}(\\mathrm{LN}_1(h)), \\qquad
    h \\leftarrow h + W_2\\, \\mathrm{gelu}(W_1\\, \\mathrm{LN}_2(h)),

with causal multi-head self-attention: position t attends to positions s <= t only
(:func:`causal_mask`), so the logits at t are a function of tokens 0..t, and the next-token loss
``cross_entropy(logits[:, t], tokens[:, t + 1])`` (the trainer's default softmax cross-entropy on
[B, T, V] logits and [B, T] targets) trains all T positions at once.

Positions are a learned table [T_max, W] added to the embeddings (GPT-2), or rotary (RoPE): the
query and key of every head are rotated by angles ``t * theta^(-2i/d)`` (theta = 10000), so the
attention scores depend on relative positions and no position parameter exists.

Parameters are ordinary flax leaves: the token embedding [V, W], the position table [T_max, W], the
kernels of the attention (qkv [W, 3W], out [W, W]), the MLP ([W, rW], [rW, W]) and the head [W, V]
are 2-D; biases and LayerNorm scales are 1-D. A communication algorithm sees them as it sees any
pytree: PowerGossip compresses every 2-D leaf, embeddings included, with the matrix view it is
given (``matrix_view="leading"`` reads the embedding as [V, W], ``"flax_kernel"`` as [W, V]; the
rank-R error of a matrix and of its transpose are the same), and gossips the 1-D leaves exactly.

References:
  A. Vaswani et al. Attention is all you need. NeurIPS 2017, arXiv:1706.03762.
  A. Radford et al. Language models are unsupervised multitask learners (GPT-2). OpenAI, 2019.
  R. Xiong et al. On layer normalization in the transformer architecture. ICML 2020,
  arXiv:2002.04745 (pre-norm).
  J. Su et al. RoFormer: enhanced transformer with rotary position embedding. arXiv:2104.09864, 2021.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

__all__ = ["POSITIONS", "Transformer", "causal_mask", "check_transformer", "rotary"]

POSITIONS = ("learned", "rotary")

_EMBED_INIT = nn.initializers.normal(stddev=0.02)


def causal_mask(length: int) -> jax.Array:
    """bool [T, T]: entry (t, s) is True where query position t may attend to key position s (s <= t)."""
    return jnp.tril(jnp.ones((length, length), dtype=bool))


def rotary(x: jax.Array, theta: float = 10000.0) -> jax.Array:
    """Rotary position embedding of queries or keys x [B, T, heads, d] (d even): the pair
    ``(x[..., i], x[..., i + d/2])`` at position t is rotated by ``t * theta^(-2i/d)``."""
    _, length, _, dim = x.shape
    half = dim // 2
    freq = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / dim)
    angle = jnp.arange(length, dtype=jnp.float32)[:, None] * freq[None, :]  # [T, d/2]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


def check_transformer(
    *, vocab: int, context: int, depth: int, width: int, heads: int, mlp_ratio: int, positions: str, dropout: float
) -> None:
    """Raises a ValueError naming the attribute and the rule when the sizes do not make a model."""
    for name, value in (
        ("vocab", vocab),
        ("context", context),
        ("depth", depth),
        ("width", width),
        ("heads", heads),
        ("mlp_ratio", mlp_ratio),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    if width % heads:
        raise ValueError(f"heads={heads} must divide width={width} (each head gets width / heads features)")
    if positions not in POSITIONS:
        raise ValueError(f"positions={positions!r} must be one of {', '.join(POSITIONS)}")
    if positions == "rotary" and (width // heads) % 2:
        raise ValueError(f"positions='rotary' needs an even head size width / heads, got {width}/{heads}")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout={dropout!r} must be a number in [0, 1)")


class _Block(nn.Module):
    """One pre-norm block: causal self-attention and an MLP, each on a LayerNorm, each residual."""

    width: int
    heads: int
    mlp_ratio: int
    positions: str
    dropout: float

    @nn.compact
    def __call__(self, h: jax.Array, train: bool) -> jax.Array:
        b, t, w = h.shape
        head_dim = w // self.heads
        qkv = nn.Dense(3 * w, name="qkv")(nn.LayerNorm(epsilon=1e-5, name="norm1")(h))
        q, k, v = jnp.split(qkv.reshape(b, t, 3 * self.heads, head_dim), 3, axis=2)  # [B, T, heads, d]
        if self.positions == "rotary":
            q, k = rotary(q), rotary(k)
        attended = jax.nn.dot_product_attention(q, k, v, mask=causal_mask(t)[None, None])
        attended = nn.Dense(w, name="out")(attended.reshape(b, t, w))
        h = h + nn.Dropout(self.dropout, deterministic=not train)(attended)
        m = nn.Dense(self.mlp_ratio * w, name="fc1")(nn.LayerNorm(epsilon=1e-5, name="norm2")(h))
        m = nn.Dense(w, name="fc2")(nn.gelu(m))
        return h + nn.Dropout(self.dropout, deterministic=not train)(m)


class Transformer(nn.Module):
    """Decoder-only pre-norm transformer language model (see the module docstring).

    Attributes:
      vocab: V, tokens and output logits (256 for byte tokens).
      context: T_max, the longest input (the size of the learned position table).
      depth: blocks.
      width: W, the model width.
      heads: attention heads; must divide W.
      mlp_ratio: hidden width of the MLP in units of W.
      positions: "learned" (a position table) or "rotary" (RoPE on queries and keys).
      dropout: dropout rate on the embeddings and the residual branches in training mode (0: off,
        the default; > 0 needs a "dropout" rng in ``apply``).

    Input: tokens int [B, T], T <= context. Output: logits [B, T, V].
    """

    vocab: int = 256
    context: int = 64
    depth: int = 2
    width: int = 128
    heads: int = 4
    mlp_ratio: int = 4
    positions: str = "learned"
    dropout: float = 0.0

    def __post_init__(self):
        check_transformer(
            vocab=self.vocab,
            context=self.context,
            depth=self.depth,
            width=self.width,
            heads=self.heads,
            mlp_ratio=self.mlp_ratio,
            positions=self.positions,
            dropout=self.dropout,
        )
        super().__post_init__()

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool = False) -> jax.Array:
        if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
            raise ValueError(f"Transformer takes integer tokens [B, T], got {tokens.dtype} {tokens.shape}")
        length = tokens.shape[1]
        if length > self.context:
            raise ValueError(f"input of {length} tokens is longer than context={self.context}")
        h = nn.Embed(self.vocab, self.width, embedding_init=_EMBED_INIT, name="embed")(tokens)
        if self.positions == "learned":
            table = self.param("positions", _EMBED_INIT, (self.context, self.width))
            h = h + table[None, :length]
        h = nn.Dropout(self.dropout, deterministic=not train)(h)
        for i in range(self.depth):
            h = _Block(self.width, self.heads, self.mlp_ratio, self.positions, self.dropout, name=f"block{i + 1}")(
                h, train
            )
        h = nn.LayerNorm(epsilon=1e-5, name="norm_final")(h)
        return nn.Dense(self.vocab, name="head")(h)
