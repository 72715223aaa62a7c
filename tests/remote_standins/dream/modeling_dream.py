"""A Dream-like remote-code model, written for sinklib's tests (not upstream code).

Traits of the real DreamModel reproduced here because they decide whether loading and tracing work:
- RoPE from ROPE_INIT_FUNCTIONS[rope_type] ("default", which transformers 5 removed), kept in a
  non-persistent `inv_freq` buffer that its own _init_weights never touches (garbage on 5.x);
- its own `from_pretrained`, which then loads DreamGenerationConfig (whose `validate` 5.x calls with a
  keyword it does not take);
- list-style `_tied_weights_keys` and `post_init()` called, as a well-behaved 4.x model;
- forward(input_ids, attention_mask, position_ids): attention_mask None, "full" or a 4D bool mask,
  SDPA through torch.nn.functional with is_causal=False and KV heads repeated first."""
from types import SimpleNamespace

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .configuration_dream import DreamConfig
from .generation_utils import DreamGenerationConfig


class DreamRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)


class DreamRotaryEmbedding(nn.Module):
    def __init__(self, config, device=None):
        super().__init__()
        self.config = config
        self.rope_type = (config.rope_scaling or {}).get("rope_type", "default")
        self.rope_init_fn = ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = self.rope_init_fn(config, device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.original_inv_freq = self.inv_freq

    def forward(self, x, position_ids):
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :].float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(x.dtype), (emb.sin() * self.attention_scaling).to(x.dtype)


def rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class DreamSdpaAttention(nn.Module):
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
        q, k = q * cos[:, None] + rotate_half(q) * sin[:, None], k * cos[:, None] + rotate_half(k) * sin[:, None]
        k, v = k.repeat_interleave(self.heads // self.kv, 1), v.repeat_interleave(self.heads // self.kv, 1)
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else None
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class DreamDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = DreamSdpaAttention(config)
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.input_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, attention_mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attention_mask)
        normed = self.post_attention_layernorm(x)
        return x + self.down_proj(nn.functional.silu(self.gate_proj(normed)) * self.up_proj(normed))


class DreamBaseModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DreamDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = DreamRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = DreamRotaryEmbedding(config)


class DreamPreTrainedModel(PreTrainedModel):
    config_class = DreamConfig
    base_model_prefix = "model"
    _supports_sdpa = True

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        model = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        model.generation_config = DreamGenerationConfig.from_pretrained(pretrained_model_name_or_path)
        return model


class DreamModel(DreamPreTrainedModel):
    _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config):
        super().__init__(config)
        self.model = DreamBaseModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

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
