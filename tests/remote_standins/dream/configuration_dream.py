"""A Dream-like remote-code configuration, written for sinklib's tests (not upstream code).

Traits of the real one: it sets `use_cache` itself (so transformers 5 keeps it), keeps the legacy
`rope_theta` / `rope_scaling` fields and calls transformers' rope_config_validation, and declares its
mask and pad ids."""
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import rope_config_validation


class DreamConfig(PretrainedConfig):
    model_type = "Dream"

    def __init__(self, vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-6, use_cache=False,
                 tie_word_embeddings=False, rope_theta=10000.0, rope_scaling=None, initializer_range=0.02,
                 mask_token_id=3, pad_token_id=2, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.use_cache = use_cache
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.initializer_range = initializer_range
        rope_config_validation(self)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.mask_token_id = mask_token_id
        self.pad_token_id = pad_token_id
