# LRT with its own training scheme on the S3 word problem (docs/evidence.md, S_3).
# Data: python prepare.py s5 --group=S3
# Interleaved subsets with S = 32 = T: every position is refined once, in order, reading the
# exact memory of the one before, so training is exact and the gradient runs through the
# whole chain (DESIGN.md 7). The paper's S=2 makes only 2 positions exact per row; the
# n_rounds option is the middle ground (R*S exact positions).
out_dir = 'out/s3_lrt'
dataset = 's5_S3'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
attn_window = 32
recurrence = 'lrt'
rec_start = 0
rec_end = 2
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
