"""A Dream-like remote-code configuration (written for sinklib's tests; not upstream code)."""
from transformers import PretrainedConfig


class DreamLikeConfig(PretrainedConfig):
    model_type = "dreamlike"

    def __init__(self, vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128, rope_theta=10000.0, rope_scaling=None,
                 rms_norm_eps=1e-6, initializer_range=0.02, tie_word_embeddings=False, mask_token_id=63, **kwargs):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.mask_token_id = mask_token_id
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
