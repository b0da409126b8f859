# stdlib_plain.py's backbone with T2MLR over the middle of the 4 layers (0-based 1..2: the paper's
# best 135M span, layers 13-18 of 30, scaled to the depth as bench.py scales it), trained with
# Jacobi iterations: D=4, gradient through the last B=2 (the official FineWeb recipe's D=16, B=4
# is for 2048-token contexts and a GPU; at D=4 a step costs 2.5x the plain one in FLOPs).
# Data: python prepare.py stdlib_char
out_dir = 'out/stdlib_t2mlr'
dataset = 'stdlib_char'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 128
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
block_size = 256
batch_size = 8
recurrence = 't2mlr'
rec_start = 1
rec_end = 2
train_mode = 'jacobi'
n_iter = 4
n_grad = 2
max_iters = 800
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 100
eval_interval = 200
eval_iters = 10
log_interval = 50
