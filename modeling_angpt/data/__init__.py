"""The data path: from the corpus a recipe names to the batches training reads, in one place, one file a stage.

- sources.py: which corpus (`resolve_source`), and what the later stages need of it, resolved before any work
  (`resolve_corpus` → `Corpus`);
- build.py: the entry for training and evaluation (`build_datasets`): loads the texts, then each stage in turn;
- tokenizer.py: the recipe's tokenizer, or a BPE trained on the corpus and cached;
- blocks.py: a corpus tokenised at start into fixed-length blocks, the validation split, needle examples;
- streaming.py: a corpus read once, split into parts that any dividing number of processes reads;
- shards.py: the memory-mapped token shards `angpt prepare` writes (prepare.py, its other entry);
- loader.py: each process's batches, in a block order that is a function of the seed and the global step.

A recipe's trip from `train` goes in once and comes out without returning to a file it left
(tests/training/test_data_path.py). May import the inference helpers and tasks/needle.py, and the training recipe's
schema (prepare.py rebuilds a recipe in its workers); never training's loop, evaluation, the services or commands.
"""
