"""Checkpoints of other models into ours (docs/architectures.md): transformers' Llama and Qwen3 into GPT+
(llama_qwen3.py) and NVIDIA's nGPT reference checkpoints into our nGPT (ngpt.py). May import the model files only;
the scripts in the repository's conversion/ folder are their command lines.
"""
