# The plain GPT on associative recall (the lookup alone: 8 key-value pairs, then 32 queries, each
# answered by its key's value). Data: python prepare.py assoc
# The lookup needs two attention heads that compose (the value's token reads its key; the query
# finds that token): at the parity recipe's learning rate, 2e-3, the model never leaves the
# plateau where it answers with the dictionary's values at random; at 1e-3 it learns the lookup
# (docs/ablations.md). Any recall task: --dataset=...
out_dir = 'out/assoc_plain'
dataset = 'assoc'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
recurrence = 'none'
train_mode = 'plain'
batch_size = 32
max_iters = 3000
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 50
eval_interval = 500
eval_examples = 1000
log_interval = 50
