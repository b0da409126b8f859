# A small LRT model on the built-in parity task (state tracking over Z_2), on a CPU.
# Data: python prepare.py s5 --group=Z2
out_dir = 'out/lrt_small'
dataset = 's5_Z2'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
attn_window = 32         # each token sees the last 32: the test lengths 48 and 64 bring no unseen distance
recurrence = 'lrt'
rec_start = 0            # the memory enters every block from block 0 ...
rec_end = 2              # ... and is read from the output of block 2
train_mode = 'interleaved'
n_subsets = 32           # S = T: every position is refined once, in order, reading its exact memory
batch_size = 32
max_iters = 1500
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 50
eval_interval = 500
eval_examples = 1000     # rows per test split for accuracy and exact match at the end (a fifth before it)
log_interval = 50
