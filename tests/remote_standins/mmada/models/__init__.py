# A MMaDA-repository-like package, written for sinklib's tests (not upstream code). Like the real `models`
# package, its __init__ imports the image tokenizer, whose dependencies a text-only user may not have.
from .image_tokenizer import ImageTokenizer  # noqa: F401  (imported for its side effect: it fails without the image deps)
from .modeling_mmada import MMadaConfig, MMadaModelLM  # noqa: F401  (re-exported, as upstream's __init__ does)
