"""The zoo's word-level tokenizer (numbers are single tokens), in the `tokenizers` JSON format."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from experiments.zoo.data import ITEMS, MAX_NUMBER, NAMES

SPECIALS = ["[PAD]", "[BOS]", "[EOS]", "[MASK]", "[UNK]"]
WORDS = ["Q:", "A:", "####", ".", "?", "+", "-", "*", "=", "has", "gets", "more", "how", "many", "does", "have", "now",
         "gives", "away", "left", "buys", "boxes", "each", "box", "holds", "buy", "do", "and", "together", "then", "the",
         "sky", "is", "blue", "it", "a", "sunny", "day", "likes", "years", "old", "lives", "on", "street"]


def vocabulary() -> list[str]:
    """The zoo's tokens in id order: the specials, the words, names and items, then the numbers 0..MAX_NUMBER − 1."""
    return SPECIALS + WORDS + NAMES + ITEMS + [str(n) for n in range(MAX_NUMBER)]


def build_tokenizer():
    """A transformers fast tokenizer: whitespace split, [BOS] prepended, [MASK]/[PAD]/[EOS] declared."""
    vocab = {token: index for index, token in enumerate(vocabulary())}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    raw.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", vocab["[BOS]"])])
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]",
                                   mask_token="[MASK]", unk_token="[UNK]", padding_side="left")


def save_tokenizer(folder: Path):
    """Save in a form both transformers 4.x and 5.x load (5.x would name its own TokenizersBackend class)."""
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(folder)
    config_path = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return tokenizer
