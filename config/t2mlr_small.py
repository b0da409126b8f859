# A small T2MLR model on the built-in parity task (state tracking over Z_2),
# on a CPU. Data: python prepare.py s5 --group=Z2
# Full-layer recurrence (layers 0..3), trained with Jacobi iterations D=8, B=4.
out_dir = 'out/t2mlr_small'
dataset = 's5_Z2'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
recurrence = 't2mlr'
rec_start = 0
rec_end = 3
train_mode = 'jacobi'
n_iter = 8
n_grad = 4
batch_size = 32
max_iters = 1500
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 50
eval_interval = 500
eval_examples = 1000     # rows per test split for accuracy and exact match
log_interval = 50
