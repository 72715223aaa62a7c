"""Programs run from a checkout, not shipped in the wheel: experiments/zoo/ trains the tiny zoo, adapts the SmolLM2
twins and retrains the zoo with checkpoints for notebook 06 (python -m experiments.zoo --help)."""
