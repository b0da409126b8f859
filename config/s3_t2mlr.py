# T2MLR on the S3 word problem (non-abelian state tracking, 6 elements): the label at each
# position is the running product of the permutations so far. Trained on lengths 1..32,
# judged with the exact recurrence at 32, 48 and 64 (docs/evidence.md, S_3).
# Data: python prepare.py s5 --group=S3
# Trained exactly (interleaved, S = T = 32: every token reads its true state, the gradient through
# the whole chain), with the recurrent gate open at init (g_rec = 1): closed, training leaves the
# plateau of S3 late or not at all (docs/recipe.md).
out_dir = 'out/s3_t2mlr'
dataset = 's5_S3'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
attn_window = 32         # test lengths 48 and 64 see no attention distance unseen in training
recurrence = 't2mlr'
rec_start = 0
rec_end = 3
rec_gate_init = 1.0
train_mode = 'interleaved'
n_subsets = 32
batch_size = 32
max_iters = 1500
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 50
eval_interval = 250
eval_examples = 1000
log_interval = 50
