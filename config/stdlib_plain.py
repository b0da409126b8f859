# Character-level language modelling on Python's own standard library (prepare.py stdlib_char:
# real text every machine has offline): the plain GPT. Sized for a 2-core CPU: 4 layers, d=128,
# context 256, 8 rows a step, 800 steps (1.6M characters). lab/compare.py trains it next to
# stdlib_t2mlr.py and stdlib_lrt.py (the same backbone) and reads bits per character on the
# held-out test files (docs/text.md).
# Data: python prepare.py stdlib_char
out_dir = 'out/stdlib_plain'
dataset = 'stdlib_char'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 128
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
block_size = 256
batch_size = 8
recurrence = 'none'
train_mode = 'plain'
max_iters = 800
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 100
eval_interval = 200
eval_iters = 10
log_interval = 50
