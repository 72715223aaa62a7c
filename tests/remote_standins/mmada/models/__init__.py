# A MMaDA-repository-like package, written for sinklib's tests (not upstream code). Like the real `models`
# package, its __init__ imports the image tokenizer, whose dependencies a text-only user may not have.
from .image_tokenizer import ImageTokenizer
from .modeling_mmada import MMadaConfig, MMadaModelLM
