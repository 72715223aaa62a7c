# Stands in for MMaDA's MAGVIT-v2 image tokenizer, which needs diffusers==0.32.2, einops, jaxtyping, omegaconf
# and typeguard: a dependency that is not installed, so importing the package's __init__ fails as it does there.
import sinklib_tests_absent_image_dependency  # noqa: F401

ImageTokenizer = None
