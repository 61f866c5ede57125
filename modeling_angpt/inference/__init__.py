"""Running a checkpoint: the check of a checkpoint directory that every command makes before it loads or writes
anything (checkpoint_check.py), and text generation through the Auto classes (generation.py, `angpt generate`).
May import the model files only.
"""
