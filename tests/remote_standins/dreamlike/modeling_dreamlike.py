"""A Dream-like remote-code model written for sinklib's tests (not upstream code). It reproduces the traits
that matter on transformers 5.x: RoPE from ROPE_INIT_FUNCTIONS["default"], a non-persistent inv_freq
buffer that its own _init_weights never touches, list-style _tied_weights_keys, SDPA called through
torch.nn.functional with a 4D bool mask, and a forward taking (input_ids, attention_mask, position_ids)."""
from types import SimpleNamespace

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .configuration_dreamlike import DreamLikeConfig


class DreamLikeRotaryEmbedding(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.rope_type = (config.rope_scaling or {}).get("rope_type", "default")
        self.rope_init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = self.rope_init_fn(config, None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def rotate(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class DreamLikeSdpaAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads, self.kv = config.num_attention_heads, config.num_key_value_heads
        self.dim = config.hidden_size // self.heads
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.dim, bias=True)
        self.k_proj = nn.Linear(config.hidden_size, self.kv * self.dim, bias=True)
        self.v_proj = nn.Linear(config.hidden_size, self.kv * self.dim, bias=True)
        self.o_proj = nn.Linear(self.heads * self.dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, attention_mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv, self.dim).transpose(1, 2)
        q, k = q * cos[:, None] + rotate(q) * sin[:, None], k * cos[:, None] + rotate(k) * sin[:, None]
        k, v = k.repeat_interleave(self.heads // self.kv, 1), v.repeat_interleave(self.heads // self.kv, 1)
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class DreamLikeLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = DreamLikeSdpaAttention(config)
        self.mlp = nn.Sequential(nn.Linear(config.hidden_size, config.intermediate_size), nn.SiLU(),
                                 nn.Linear(config.intermediate_size, config.hidden_size))
        self.norm1 = nn.LayerNorm(config.hidden_size)
        self.norm2 = nn.LayerNorm(config.hidden_size)

    def forward(self, x, cos, sin, attention_mask):
        x = x + self.self_attn(self.norm1(x), cos, sin, attention_mask)
        return x + self.mlp(self.norm2(x))


class DreamLikeBase(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DreamLikeLayer(config) for _ in range(config.num_hidden_layers))
        self.rotary_emb = DreamLikeRotaryEmbedding(config)
        self.norm = nn.LayerNorm(config.hidden_size)


class DreamLikeModel(PreTrainedModel):
    config_class = DreamLikeConfig
    base_model_prefix = "model"
    _tied_weights_keys = ["lm_head.weight"]
    _supports_sdpa = True

    def __init__(self, config):
        super().__init__(config)
        self.model = DreamLikeBase(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand(input_ids.shape[0], -1)
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.model.rotary_emb(x, position_ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin, attention_mask)
        return SimpleNamespace(logits=self.lm_head(self.model.norm(x)))
