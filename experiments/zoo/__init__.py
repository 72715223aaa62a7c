"""The zoo's training programs (python -m experiments.zoo): the data generator and prompt sets (data.py), the
word-level tokenizer (tokenizer.py), the training objectives, checkpoints and model cards (train.py), the training
loop they share with the twins (loop.py), a zoo model's accuracy and card (evaluate.py), SmolLM2's adaptation to masked
diffusion and its autoregressive twin (adapt.py: LoRA via peft) and sinks over training, retrained and measured
(retrain.py). The recipes they follow and the rows they write are sinklib.zoo's (recipes.py, over_training.py)."""
