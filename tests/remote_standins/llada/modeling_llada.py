"""A LLaDA-like remote-code model, written for sinklib's tests (not upstream code).

Traits of the real LLaDAModelLM reproduced here because they decide whether loading and tracing work:
- `LLaDAModelLM(PreTrainedModel)` wraps a plain `nn.Module` (`model.transformer.blocks[i]`) built from a
  dataclass copy of the config (every field read with getattr), and never calls `post_init()`;
- `tie_weights(self)` takes no arguments and ties by assignment;
- forward reads `self.config.use_cache` when `use_cache` is None, passes it on, and the inner model
  asserts that no KV cache is asked for; `output_attentions=True` raises ValueError;
- RoPE sin/cos live in a plain dict cache (no buffers), computed in float32 on the init device;
- padding arrives as [B, S] 0/1 and becomes an additive float bias; KV heads are repeated before
  `torch.nn.functional.scaled_dot_product_attention`, looked up at call time, with is_causal=False;
- importing the module registers the model class for AutoModel."""
from dataclasses import fields

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_llada import LLaDAConfig, ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.eps = config.rms_norm_eps
        self.weight = nn.Parameter(torch.ones(config.d_model))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: ModelConfig, cache: dict):
        super().__init__()
        self.config, self.cache = config, cache
        self.get(config.max_sequence_length, torch.device(config.init_device or "cpu"))  # warm up, as upstream

    def get(self, seq_len: int, device):
        if "sin" in self.cache and self.cache["sin"].shape[-2] >= seq_len:
            return self.cache["sin"][:, :, :seq_len].to(device), self.cache["cos"][:, :, :seq_len].to(device)
        dim = self.config.d_model // self.config.n_heads
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float) / dim))
        freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float), inv_freq)
        positions = torch.cat((freqs, freqs), dim=-1)
        self.cache["sin"], self.cache["cos"] = positions.sin()[None, None], positions.cos()[None, None]
        return self.cache["sin"], self.cache["cos"]

    def forward(self, q, k):
        sin, cos = self.get(q.shape[-2], q.device)
        def rotate(t):
            first, second = t.float().chunk(2, dim=-1)
            return torch.cat((-second, first), dim=-1)
        return ((q.float() * cos + rotate(q) * sin).to(q.dtype), (k.float() * cos + rotate(k) * sin).to(k.dtype))


class LLaDALlamaBlock(nn.Module):
    def __init__(self, config: ModelConfig, cache: dict):
        super().__init__()
        self.config = config
        d, heads = config.d_model, config.n_heads
        kv = config.n_kv_heads or heads
        self.head_dim = d // heads
        self.attn_norm, self.ff_norm = RMSNorm(config), RMSNorm(config)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv * self.head_dim, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)
        self.up_proj = nn.Linear(d, config.mlp_hidden_size, bias=False)
        self.ff_out = nn.Linear(config.mlp_hidden_size, d, bias=False)
        self.rotary_emb = RotaryEmbedding(config, cache)

    def attention(self, q, k, v, attention_bias):
        b, s, _ = q.shape
        heads, kv = self.config.n_heads, self.config.n_kv_heads or self.config.n_heads
        q = q.view(b, s, heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, kv, self.head_dim).transpose(1, 2)
        v = v.view(b, s, kv, self.head_dim).transpose(1, 2)
        q, k = self.rotary_emb(q, k)
        k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_bias, dropout_p=0.0, is_causal=False)
        return self.attn_out(out.transpose(1, 2).reshape(b, s, -1))

    def forward(self, x, attention_bias=None):
        normed = self.attn_norm(x)
        x = x + self.attention(self.q_proj(normed), self.k_proj(normed), self.v_proj(normed), attention_bias)
        normed = self.ff_norm(x)
        return x + self.ff_out(F.silu(self.ff_proj(normed)) * self.up_proj(normed))


class LLaDAModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        cache: dict = {}
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.embedding_size or config.vocab_size, config.d_model),
            blocks=nn.ModuleList(LLaDALlamaBlock(config, cache) for _ in range(config.n_layers)),
            ln_f=RMSNorm(config)))
        if not config.weight_tying:
            self.transformer.update({"ff_out": nn.Linear(config.d_model, config.embedding_size or config.vocab_size, bias=False)})

    def forward(self, input_ids, attention_mask=None, past_key_values=None, use_cache=False):
        assert past_key_values is None and not use_cache, "The kvcache is not supported for MDM."
        x = self.transformer.wte(input_ids)
        bias = None
        if attention_mask is not None and not bool(attention_mask.all()):
            keys = attention_mask.to(torch.float)[:, None, None, :]
            bias = (1.0 - keys) * torch.finfo(keys.dtype).min
            bias = bias.expand(-1, 1, input_ids.shape[1], -1).to(x.dtype)
        for block in self.transformer.blocks:
            x = block(x, bias)
        x = self.transformer.ln_f(x)
        if self.config.weight_tying:
            return F.linear(x, self.transformer.wte.weight)
        return self.transformer.ff_out(x)


def create_model_config_from_pretrained_config(config: LLaDAConfig) -> ModelConfig:
    return ModelConfig(**{field.name: getattr(config, field.name) for field in fields(ModelConfig)})


class LLaDAModelLM(PreTrainedModel):
    config_class = LLaDAConfig
    base_model_prefix = "model"

    def __init__(self, config: LLaDAConfig, model: LLaDAModel | None = None, init_params: bool = False):
        super().__init__(config)
        if not model:
            model_config = create_model_config_from_pretrained_config(config)
            model_config.init_device = "cpu"
            model = LLaDAModel(model_config)
        self.model = model

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, use_cache=None,
                output_attentions=None, return_dict=None, **kwargs):
        if use_cache is None:
            use_cache = self.config.use_cache
        if output_attentions:
            raise ValueError("output_attentions is not yet supported in LLaDA")
        logits = self.model(input_ids, attention_mask=attention_mask, past_key_values=past_key_values, use_cache=use_cache)
        return CausalLMOutputWithPast(logits=logits)

    def get_input_embeddings(self):
        return self.model.transformer.wte

    def tie_weights(self):
        if self.config.weight_tying:
            self.model.transformer.ff_out = self.model.transformer.wte


AutoModel.register(LLaDAConfig, LLaDAModelLM)
