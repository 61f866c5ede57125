"""Writing a checkpoint for others: the folded inference form (fold.py, docs/inference-fold.md), one ONNX graph of
it (onnx.py) and the model card with `save_pretrained`/`push_to_hub` (hub.py).

May import the model files, inference/ and data/'s tokenizer settings; training imports hub.py to write its final
checkpoint.
"""
