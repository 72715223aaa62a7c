"""A Dream-like generation config, written for sinklib's tests (not upstream code): it overrides
`validate(self, is_init=False)` with no other keyword, which transformers 5 calls with more."""
from transformers import GenerationConfig


class DreamGenerationConfig(GenerationConfig):
    def __init__(self, **kwargs):
        self.temperature = kwargs.pop("temperature", 0.0)
        self.top_p = kwargs.pop("top_p", None)
        self.top_k = kwargs.pop("top_k", None)
        self.max_length = kwargs.pop("max_length", 20)
        self.max_new_tokens = kwargs.pop("max_new_tokens", None)
        self.eps = kwargs.pop("eps", 1e-3)
        self.steps = kwargs.pop("steps", 512)
        self.alg = kwargs.pop("alg", "origin")
        self.alg_temp = kwargs.pop("alg_temp", None)
        self.mask_token_id = kwargs.pop("mask_token_id", None)
        self.pad_token_id = kwargs.pop("pad_token_id", None)
        self.bos_token_id = kwargs.pop("bos_token_id", None)
        self.eos_token_id = kwargs.pop("eos_token_id", None)
        self._from_model_config = kwargs.pop("_from_model_config", False)
        self._commit_hash = kwargs.pop("_commit_hash", None)
        self.transformers_version = kwargs.pop("transformers_version", None)
        if not self._from_model_config:
            for key, value in kwargs.items():
                setattr(self, key, value)
        self.validate(is_init=True)

    def validate(self, is_init=False):
        pass
