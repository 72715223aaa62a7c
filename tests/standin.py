"""A tiny stand-in for remote-code diffusion LMs (LLaDA/MMaDA style): attention is a method of the block,
RoPE is computed by hand, KV heads are repeated before the call, padding arrives as an additive float mask,
and SDPA is looked up on `torch.nn.functional` at call time — the way the upstream models do it.

`sink_strength > 0` adds that much to every attention logit towards key tokens equal to `sink_token`,
through the additive mask the model passes to SDPA: a designed, deterministic sink for testing policies
(random tiny weights rarely produce Eq. 3 sinks).

`eager=True` computes the same attention by explicit softmax instead (the independent reference), and can
add a per-layer additive key bias to reproduce a masking intervention by hand."""
from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Block(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        d, h, kv = config.d_model, config.n_heads, config.n_kv_heads
        self.head_dim = d // h
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv * self.head_dim, bias=False)
        self.attn_out = nn.Linear(d, d, bias=False)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)

    def rope(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[-2]
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        emb = torch.cat((angles, angles), dim=-1)
        return x * emb.cos() + rotate_half(x) * emb.sin()

    def attention(self, x, bias, eager, key_bias):
        b, s, _ = x.shape
        h, kv, hd = self.config.n_heads, self.config.n_kv_heads, self.head_dim
        q = self.rope(self.q_proj(x).view(b, s, h, hd).transpose(1, 2))
        k = self.rope(self.k_proj(x).view(b, s, kv, hd).transpose(1, 2))
        v = self.v_proj(x).view(b, s, kv, hd).transpose(1, 2)
        k = k.repeat_interleave(h // kv, dim=1)
        v = v.repeat_interleave(h // kv, dim=1)
        if eager:
            logits = q @ k.transpose(-1, -2) / math.sqrt(hd)
            if bias is not None:
                logits = logits + bias
            if self.config.causal:
                logits = logits.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
            if key_bias is not None:
                logits = logits + key_bias[:, :, None, :]
            probs = torch.softmax(logits, dim=-1)
            out = probs @ v
        else:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.0,
                                                                   is_causal=self.config.causal and bias is None)
            probs = None
        return self.attn_out(out.transpose(1, 2).reshape(b, s, -1)), probs

    def forward(self, x, bias=None, eager=False, key_bias=None):
        attn, probs = self.attention(self.norm1(x), bias, eager, key_bias)
        x = x + attn
        return x + self.ff(self.norm2(x)), probs


class Transformer(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)


class StandInLM(nn.Module):
    """LLaDA-like: `model.transformer.blocks[i]`, attention computed inside the block."""

    def __init__(self, n_layers=3, n_heads=4, n_kv_heads=2, d_model=32, vocab_size=64, causal=False, seed=0,
                 sink_token=5, sink_strength=0.0) -> None:
        super().__init__()
        self.config = SimpleNamespace(n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads, d_model=d_model,
                                      vocab_size=vocab_size, causal=causal,
                                      sink_token=sink_token, sink_strength=sink_strength)
        torch.manual_seed(seed)
        self.transformer = Transformer(self.config)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        for p in self.parameters():
            nn.init.normal_(p, std=0.3)

    def forward(self, input_ids, attention_mask=None, eager=False, key_bias=None, return_attentions=False):
        bias = None
        if self.config.sink_strength:
            bias = ((input_ids == self.config.sink_token).float() * self.config.sink_strength)[:, None, None, :]
        if attention_mask is not None:  # additive float key-padding mask, as LLaDA builds it
            bias = torch.zeros(attention_mask.shape, dtype=torch.float32)[:, None, None, :] if bias is None else bias
            bias = bias.masked_fill(attention_mask[:, None, None, :] == 0, torch.finfo(torch.float32).min)
        if bias is not None and self.config.causal:
            causal = torch.ones(input_ids.shape[1], input_ids.shape[1], dtype=torch.bool).tril()
            bias = bias.masked_fill(~causal, torch.finfo(torch.float32).min)
        x = self.transformer.wte(input_ids)
        attentions = []
        for index, block in enumerate(self.transformer.blocks):
            x, probs = block(x, bias, eager, None if key_bias is None else key_bias.get(index))
            attentions.append(probs)
        logits = self.lm_head(self.transformer.ln_f(x))
        return (logits, attentions) if return_attentions else logits


class StandInLLaDA(StandInLM):
    """Returns an output object with .logits, as LLaDA's remote code does."""

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return SimpleNamespace(logits=super().forward(input_ids, attention_mask=attention_mask, **kwargs))
