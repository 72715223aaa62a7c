"""Hub-style checkpoint folders of the paper's four families, as a user downloads them: config.json (with
`auto_map` where the checkpoint ships code), the modelling files, safetensors weights, a tokenizer with the
family's special tokens and chat template, Dream's generation_config.json.

The code comes from tests/remote_standins/ (our stand-ins). The same builder takes any folder of real
upstream files instead (`python -m tests.checkpoints llada /tmp/llada --code /path/to/upstream/files`), which
is how a developer runs the same flow on the real code; nothing upstream is committed or needed by a test.

`reference(folder)` rebuilds the model straight from the folder's files (its own classes, its own config
class, the saved weights), without sinklib and without transformers' loader: what sinklib.load must give.
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json
import shutil
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

STANDINS = Path(__file__).parent / "remote_standins"
WORDS = ["tom", "has", "5", "7", "apples", ".", "gets", "more", "how", "many", "does", "have", "now", "?", "the", "is",
         "a", "you", "are", "helpful", "assistant", "system", "user", "Tom", "How", "apples.", "now?"]
VOCAB = 128  # padded like the real checkpoints (their embedding tables are larger than their tokenizers)

# family → special tokens (in id order after the words), the mask token, the chat template
SPECIALS = {
    "llada": ["<|startoftext|>", "<|endoftext|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|mdm_mask|>"],
    "dream": ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|beginoftext|>", "<|mask|>"],
    "llama": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"],
}
SPECIALS["mmada"] = SPECIALS["llada"]
LLAMA3_TEMPLATE = ("{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|> '"
                   " + message['content'] | trim + ' <|eot_id|> ' %}"
                   "{% if loop.index0 == 0 %}{% set content = bos_token + ' ' + content %}"
                   "{% endif %}{{ content }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|> ' }}{% endif %}")
CHATML_TEMPLATE = ("{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
                   "{{ '<|im_start|>system You are a helpful assistant. <|im_end|> ' }}{% endif %}"
                   "{{ '<|im_start|>' + message['role'] + ' ' + message['content'] + ' <|im_end|> ' }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|im_start|>assistant ' }}{% endif %}")


def token_ids(family: str) -> dict[str, int]:
    return {token: index for index, token in enumerate(WORDS + SPECIALS[family])}


def _llada_fields(family: str) -> dict:
    ids = token_ids(family)
    return {"d_model": 64, "n_heads": 4, "n_kv_heads": 4, "n_layers": 2, "mlp_hidden_size": 128, "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5, "vocab_size": VOCAB, "embedding_size": VOCAB, "weight_tying": False,
            "max_sequence_length": 256, "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
            "mask_token_id": ids["<|mdm_mask|>"], "init_device": "meta", "use_cache": False, "transformers_version": "4.46.3",
            # every other field of LLaDA's ModelConfig, as the real config.json files list them: MMaDA's config class
            # keeps only what the file gives, and LLaDA's code reads each field from it
            "mlp_ratio": 4, "activation_type": "silu", "block_type": "llama", "block_group_size": 1, "alibi": False,
            "alibi_bias_max": 8.0, "rope": True, "rope_full_precision": True, "flash_attention": False,
            "attention_dropout": 0.0, "multi_query_attention": None, "attention_layer_norm": False,
            "residual_dropout": 0.0, "embedding_dropout": 0.0, "input_emb_norm": False, "layer_norm_type": "rms",
            "layer_norm_with_affine": True, "attention_layer_norm_with_affine": True, "include_qkv_bias": False,
            "include_bias": False, "bias_for_layer_norm": False, "scale_logits": False, "init_fn": "mitchell",
            "init_std": 0.02, "init_cutoff_factor": None, "precision": "amp_bf16"}


def config_for(family: str) -> dict:
    ids = token_ids(family)
    if family == "llada":
        return {"model_type": "llada", "architectures": ["LLaDAModelLM"], **_llada_fields(family),
                "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM",
                             "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"}}
    if family == "mmada":  # MMaDA's checkpoints name no code: the class comes from the MMaDA repository
        return {"model_type": "mmada", "architectures": ["MMadaModelLM"], **_llada_fields(family),
                "llm_vocab_size": VOCAB, "codebook_size": 8, "num_vq_tokens": 4}
    if family == "dream":
        return {"model_type": "Dream", "architectures": ["DreamModel"], "vocab_size": VOCAB, "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
                "tie_word_embeddings": False, "use_cache": False, "torch_dtype": "bfloat16",
                "mask_token_id": ids["<|mask|>"], "pad_token_id": ids["<|endoftext|>"], "bos_token_id": ids["<|beginoftext|>"],
                "eos_token_id": ids["<|endoftext|>"], "transformers_version": "4.46.2",
                "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"}}
    raise ValueError(f"family={family!r}: one of llada, mmada, dream (llama is built by build_llama)")


def _write_tokenizer(family: str, folder: Path) -> None:
    ids = token_ids(family)
    specials = SPECIALS[family]
    if family == "dream":  # a slow tokenizer named through auto_map, as Dream's is
        vocabulary = {w: i for w, i in ids.items() if w not in specials[1:]}  # the slow tokenizer's unknown-word id too
        (folder / "vocab.json").write_text(json.dumps(vocabulary))
        added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                               "special": True} for t in specials}
        config = {"added_tokens_decoder": added, "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
                  "tokenizer_class": "DreamTokenizer", "bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>",
                  "pad_token": "<|endoftext|>", "mask_token": "<|mask|>", "chat_template": CHATML_TEMPLATE,
                  "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "model_max_length": 256}
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
        return
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

    # written by hand, as 4.x-era checkpoints hold them: both transformers majors read these files alike
    raw = Tokenizer(models.WordLevel(ids, unk_token=specials[1]))  # specials keep these ids when marked special below
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    raw.save(str(folder / "tokenizer.json"))
    added = {str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                           "special": True} for t in specials}
    config = {"added_tokens_decoder": added, "bos_token": specials[0], "eos_token": specials[1], "pad_token": specials[1],
              "chat_template": LLAMA3_TEMPLATE, "clean_up_tokenization_spaces": False, "model_max_length": 256,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _import_folder(folder: Path, files: list[str]) -> dict[str, types.ModuleType]:
    name = f"checkpoint_code_{next(_counter)}"
    package = types.ModuleType(name)
    package.__path__ = [str(folder)]
    sys.modules[name] = package
    return {f: importlib.import_module(f"{name}.{f}") for f in files}


_counter = itertools.count()


def _classes(family: str, code: Path):
    if family == "dream":
        modules = _import_folder(code, ["configuration_dream", "modeling_dream"])
        return modules["configuration_dream"].DreamConfig, modules["modeling_dream"].DreamModel
    if family == "mmada":
        module = _import_folder(code, ["modeling_mmada"])["modeling_mmada"]
        return module.MMadaConfig, module.MMadaModelLM
    modules = _import_folder(code, ["configuration_llada", "modeling_llada"])
    return modules["configuration_llada"].LLaDAConfig, modules["modeling_llada"].LLaDAModelLM


def _construct(family: str, code: Path, config: dict) -> torch.nn.Module:
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5 and family == "dream":
        from sinklib import compat  # only registers the standard RoPE formula that 5.x removed

        compat.apply_default_rope()
    config_class, model_class = _classes(family, code)
    config_object = config_class(**{k: v for k, v in config.items() if k not in ("auto_map", "model_type")})
    if "use_cache" not in vars(config_object):  # transformers 5 drops it; the reference runs as on 4.x
        config_object.use_cache = config.get("use_cache", False)
    return model_class(config_object).eval()


def mmada_repository(root: Path, llada_code: Path | None = None, mmada_code: Path | None = None) -> Path:
    """A MMaDA-repository-like folder: models/ with the MMaDA stand-in and a copy of LLaDA's files."""
    models = root / "models"
    shutil.copytree(mmada_code or STANDINS / "mmada" / "models", models, dirs_exist_ok=True)
    if llada_code is not None or not (models / "modeling_llada.py").exists():
        for source in (llada_code or STANDINS / "llada").glob("*.py"):
            shutil.copy(source, models)
    return root


def build(family: str, folder: str | Path, code: str | Path | None = None, seed: int = 0) -> Path:
    """Write a hub-style folder of `family` built from `code` (default: our stand-in). For mmada, `code` is
    the `models` folder of a MMaDA repository (mmada_repository())."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = config_for(family)
    code = Path(code) if code else (STANDINS / family if family != "mmada" else None)
    if family == "mmada" and code is None:
        raise ValueError("code: the `models` folder of a MMaDA-like repository (see mmada_repository())")
    if family != "mmada":  # MMaDA checkpoints ship no code
        for source in code.glob("*.py"):
            shutil.copy(source, folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    if family == "dream":
        ids = token_ids("dream")
        (folder / "generation_config.json").write_text(json.dumps({
            "bos_token_id": ids["<|beginoftext|>"], "eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
            "mask_token_id": ids["<|mask|>"], "transformers_version": "4.46.2"}))
    _write_tokenizer(family, folder)
    model = _construct(family, code, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # large random weights give peaked, sink-like attention
        for name, parameter in sorted(model.named_parameters()):
            norm = parameter.dim() == 1 and "norm" in name
            parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape, generator=generator) if norm
                            else 0.3 * torch.randn(parameter.shape, generator=generator))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def build_llama(folder: str | Path, seed: int = 0) -> Path:
    """A native transformers Llama (the autoregressive baseline's architecture) with a Llama-3-style tokenizer."""
    import transformers

    folder = Path(folder)
    ids = token_ids("llama")
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      bos_token_id=ids["<|begin_of_text|>"],
                                      eos_token_id=[ids["<|end_of_text|>"], ids["<|eot_id|>"]])
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(std=0.3)
    model.save_pretrained(folder)
    _write_tokenizer("llama", folder)
    return folder


def reference(folder: str | Path, family: str, code: str | Path | None = None) -> torch.nn.Module:
    """The model rebuilt straight from the folder's own files and weights (no sinklib, no from_pretrained)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    model = _construct(family, Path(code) if code else folder, config)
    model.load_state_dict(load_file(folder / "model.safetensors"))
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", choices=["llada", "mmada", "dream", "llama"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--code", type=Path, help="a folder of modelling files (default: our stand-in)")
    args = parser.parse_args(argv)
    print(build_llama(args.folder) if args.family == "llama" else build(args.family, args.folder, args.code))


if __name__ == "__main__":
    main()
