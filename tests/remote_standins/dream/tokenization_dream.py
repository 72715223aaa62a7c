"""A Dream-like slow tokenizer, written for sinklib's tests (not upstream code): like the real one it is
a Python `PreTrainedTokenizer` that a checkpoint names through `auto_map`, so it loads only with
trust_remote_code. Whitespace-split words over vocab.json."""
import json
import os

from transformers import PreTrainedTokenizer


class DreamTokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "vocab.json"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, **kwargs):
        with open(vocab_file, encoding="utf-8") as handle:
            self.encoder = json.load(handle)
        self.decoder = {index: token for token, index in self.encoder.items()}
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return len(self.encoder)

    def get_vocab(self):
        return dict(self.encoder, **self.added_tokens_encoder)

    def _tokenize(self, text, **kwargs):
        return text.split()

    def _convert_token_to_id(self, token):
        return self.encoder.get(token, self.encoder["<|endoftext|>"])

    def _convert_id_to_token(self, index):
        return self.decoder.get(index, "<|endoftext|>")

    def convert_tokens_to_string(self, tokens):
        return " ".join(tokens)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        path = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "vocab.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.encoder, handle)
        return (path,)
