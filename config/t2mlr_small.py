# A small T2MLR model on the built-in parity task (state tracking over Z_2), on a CPU.
# Data: python prepare.py s5 --group=Z2
# Full-layer recurrence (layers 0..3). The recipe of docs/recipe.md:
# - exact states with a one-step gradient: Jacobi with D = 32 = T iterations, so every position reads
#   its true state (D = 8 < T trains on wrong states), and the gradient through the last iteration and
#   the final pass only (B = 1): the gradient through the whole 32-step chain (exact interleaved
#   training, S = T) brings bursts that throw runs back, and its init pass's loss pushes a solved model;
# - the recurrent gate closed at init (g_rec = 0, the official identity init); config/s3_t2mlr.py opens it;
# - the scalar gates g_cur, g_rec at a tenth of the learning rate: the trained model carries its state
#   through a small g_rec, and a burst of gradient would move it by a large fraction of its value;
# - a 32-token attention window, so that test lengths 48 and 64 see no distance unseen in training.
out_dir = 'out/t2mlr_small'
dataset = 's5_Z2'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
attn_window = 32
recurrence = 't2mlr'
rec_start = 0
rec_end = 3
train_mode = 'jacobi'
n_iter = 32
n_grad = 1
batch_size = 32
max_iters = 1500
learning_rate = 2e-3
gate_lr_mult = 0.1
min_lr = 2e-4
warmup_iters = 50
eval_interval = 500
eval_examples = 1000     # rows per test split for accuracy and exact match
log_interval = 50
