# The plain GPT baseline on the built-in parity task (state tracking over Z_2),
# on a CPU. Data: python prepare.py s5 --group=Z2
out_dir = 'out/plain_small'
dataset = 's5_Z2'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
recurrence = 'none'
train_mode = 'plain'
batch_size = 32
max_iters = 1500
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 50
eval_interval = 500
eval_examples = 1000     # rows per test split for accuracy and exact match
log_interval = 50
