"""A MMaDA-like language model, written for sinklib's tests (not upstream code). Traits of the real one:
its config is a plain PretrainedConfig (not LLaDA's) that passes every key through, `use_cache` included;
its model subclasses LLaDA's LLaDAModelLM from the sibling modeling_llada.py (a copy of LLaDA's code) and
adds nothing to loading; importing the module registers the "mmada" type, and no checkpoint carries an
auto_map. The test copies the LLaDA stand-in's two files beside this one."""
from transformers import AutoConfig, AutoModel, PretrainedConfig

from .modeling_llada import LLaDAModelLM


class MMadaConfig(PretrainedConfig):
    model_type = "mmada"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for key in ("vocab_size", "llm_vocab_size", "codebook_size", "num_vq_tokens", "new_vocab_size"):
            if key in kwargs:
                setattr(self, key, kwargs[key])


class MMadaModelLM(LLaDAModelLM):
    config_class = MMadaConfig
    base_model_prefix = "model"

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)


AutoConfig.register("mmada", MMadaConfig)
AutoModel.register(MMadaConfig, MMadaModelLM)
