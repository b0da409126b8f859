"""
What the scripts at the top level (train.py, sample.py, prepare.py, bench.py) and lab/ build on:

  checks.py       the checks of a model's, a training scheme's and generation's settings
  checkpoint.py   checkpoints in and out of model.GPT, and the import of a pretrained HF Llama
  dataset.py      the dataset format (prepare.py writes it, the rest read it), locks, tokenizers
  tasks.py        the synthetic tasks (s5, s5_retrieval, varassign, assoc) and their labels
  corpora.py      text corpora (local text, Hub corpora) as token streams
  sft.py          prompt/response data for fine-tuning a pretrained model (retrofit)
  trainutil.py    train.py's housekeeping: start-up checks, model args, signals, step statistics
  diagnostics.py  watching a model: gates, states, task accuracy, Jacobi profiles, activation bytes
  flops.py        FLOPs per token of a training step under each scheme (MFU, equal-compute arms)
  lstm.py         the LSTM baseline, trained and sampled through the same scripts as the GPT
"""
