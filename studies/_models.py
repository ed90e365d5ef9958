"""Transformer shapes of the models the studies train and serve (from their published configs)."""

from __future__ import annotations

from dataclasses import dataclass

from autoscout_optuna._megatron_memory import layer_params


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer with grouped-query attention and a SwiGLU MLP.

    Attributes:
        name: Registry name, e.g. ``"llama3-8b"``.
        layers: Transformer layers.
        hidden: Hidden size.
        ffn: MLP intermediate size.
        heads: Query heads.
        kv_heads: Key/value heads (GQA groups).
        vocab: Vocabulary size (input and output embeddings are untied).
    """

    name: str
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def layer_params(self) -> int:
        """Weights of one layer: Q/K/V/O projections, gate/up/down MLP, two norms."""
        return layer_params(hidden=self.hidden, ffn_hidden=self.ffn, heads=self.heads,
                            kv_heads=self.kv_heads)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """Total weights (two embeddings, untied)."""
        return self.layers * self.layer_params + 2 * self.embedding_params + self.hidden


# Values from the models' Hugging Face config.json files.
MODELS: dict[str, ModelShape] = {
    "llama3-8b": ModelShape("llama3-8b", 32, 4096, 14336, 32, 8, 128256),
    "llama3-70b": ModelShape("llama3-70b", 80, 8192, 28672, 64, 8, 128256),
    "qwen2.5-7b": ModelShape("qwen2.5-7b", 28, 3584, 18944, 28, 4, 152064),
    "qwen2.5-14b": ModelShape("qwen2.5-14b", 48, 5120, 13824, 40, 8, 152064),
    "qwen2.5-32b": ModelShape("qwen2.5-32b", 64, 5120, 27648, 40, 8, 152064),
    "mistral-7b": ModelShape("mistral-7b", 32, 4096, 14336, 32, 8, 32768),
}


def model_shape(name: str) -> ModelShape:
    """The shape of ``name``; raises ValueError naming the ``model`` option if unknown."""
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"model must be one of {sorted(MODELS)}, got {name!r}") from None
