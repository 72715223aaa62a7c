"""The model families: one file each, the sampler and the settings dataclass a family's models generate with.

- `base`: what a family is (`Family`), the registry (`register_family`, `get_family`), the layout rule (`fit`).
- `llada`: LLaDA and MMaDA (low-confidence remasking in blocks); `LLaDASettings`.
- `dream`: Dream and the diffusion twin (entropy / confidence orders, shifted logits); `DreamSettings`.
- `arm`: autoregressive models (Llama, SmolLM2, the autoregressive twin; greedy with a KV cache); `ARMSettings`.
- `diffusion_gemma`: DiffusionGemma (block diffusion over uniform noise, no mask token: "not yet accepted" stands
  for masked); `DiffusionGemmaSettings`.
- `udlm`: DiffusionGemma's sampler on one bidirectional model, uniform noise without a mask token (the zoo's
  tiny-udlm); `UniformNoiseSettings`.
- `cached`: the Fast-dLLM samplers (dual cache, parallel decoding by a confidence threshold) the two diffusion
  families share.

Families register by import path (families.base), so importing this package imports none of them.
"""
