# Runs with python lab/train.py config/s3_lstm.py (the research model's arch='lstm').
# The LSTM baseline (support/lstm.py) on the S3 word problem, for the comparison with the GPT, T2MLR and
# LRT at the same parameter count: 4 LSTM layers (as the 4-layer GPT) of hidden size 81, whose
# embedding and tied head are 81 wide too: 222,912 parameters against the d=64 GPT's 221,760
# (the official S5-Retrieval baseline's rule: the transformer's layers, the hidden size that
# matches its count; support/lstm.py). The same data, schedule and evaluation as config/s3_t2mlr.py;
# its one forward is exact, so train_mode is 'plain' and approx = exact = zero-state.
# Data: python prepare.py s5 --group=S3. Any task: lab/compare.py's 'lstm' runs this with --dataset.
# Its learning rate, 1e-2, is 5x the GPT's: the official recipe trains its LSTM at 10x its
# transformer's, and at the GPT's rate this one stays on the plateau (docs/ablations.md).
out_dir = 'out/s3_lstm'
dataset = 's5_S3'
arch = 'lstm'
n_layer = 4
n_embd = 81
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
recurrence = 'none'
train_mode = 'plain'
batch_size = 32
max_iters = 1500
learning_rate = 1e-2
min_lr = 1e-3
warmup_iters = 50
eval_interval = 250
eval_examples = 1000
log_interval = 50
