"""A LLaDA-like remote-code configuration, written for sinklib's tests (not upstream code).

Traits of the real one that matter: every model field has a default in a plain dataclass; `use_cache` is
passed up to PretrainedConfig (which transformers 5 drops: generation parameters are popped there); the
sizes are exposed as properties; importing the module registers the "llada" config type."""
from dataclasses import dataclass

from transformers import AutoConfig, PretrainedConfig


@dataclass
class ModelConfig:
    d_model: int = 64
    n_heads: int = 4
    n_kv_heads: int | None = None
    n_layers: int = 2
    mlp_hidden_size: int = 128
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    vocab_size: int = 128
    embedding_size: int | None = 128
    weight_tying: bool = False
    max_sequence_length: int = 256
    eos_token_id: int = 2
    pad_token_id: int = 2
    mask_token_id: int | None = 3
    init_device: str | None = None


class LLaDAConfig(PretrainedConfig):
    model_type = "llada"

    def __init__(self, use_cache: bool = False, **kwargs):
        all_kwargs = ModelConfig().__dict__
        all_kwargs.update(kwargs)
        all_kwargs.update({"use_cache": use_cache})
        all_kwargs.setdefault("architectures", ["LLaDAModelLM"])
        super().__init__(**all_kwargs)

    @property
    def num_attention_heads(self):
        return self.n_heads

    @property
    def num_hidden_layers(self):
        return self.n_layers

    @property
    def hidden_size(self):
        return self.d_model


AutoConfig.register("llada", LLaDAConfig)
