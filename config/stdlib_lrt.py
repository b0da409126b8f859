# stdlib_plain.py's backbone with LRT-shared: the memory from layer 2 of 4 (about 0.6 L, as the
# paper's 12 of 20) injected into every layer, trained with interleaved subsets S=2 (the paper's;
# a step costs about 2x the plain one).
# Data: python prepare.py stdlib_char
out_dir = 'out/stdlib_lrt'
dataset = 'stdlib_char'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 128
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
block_size = 256
batch_size = 8
recurrence = 'lrt'
rec_start = 0
rec_end = 2
train_mode = 'interleaved'
n_subsets = 2
max_iters = 800
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 100
eval_interval = 200
eval_iters = 10
log_interval = 50
