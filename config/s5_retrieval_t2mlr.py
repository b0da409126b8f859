# T2MLR on S5-Retrieval (the paper's synthetic benchmark, DESIGN.md 10): track a running
# permutation of 5 elements AND retrieve a 4-character value for the current state from a
# dictionary in context. Trained on 1..32 moves, tested at 48 and 64.
# Paper: near-perfect in distribution, ~0.86 token accuracy at 48 moves; plain
# Transformers and LSTMs fail. The hyperparameters below are ours (a GPU run, never run:
# no GPU was lent to us), not the paper's; NoPE and the residual detach are the official
# recipe's. On S3 at CPU scale (README, "Non-abelian groups") the model learned only once
# every training position read its exact state (D >= the row length); the official recipe
# trains with D=16 on 761-token rows, so if this run stalls, raise n_iter first.
# Data: python prepare.py s5_retrieval --group=S5   (rows of 761 tokens; 921 at 64 moves)
# Baseline: add --recurrence=none --train_mode=plain --out_dir=out/s5_retrieval_plain
out_dir = 'out/s5_retrieval_t2mlr'
dataset = 's5_retrieval_S5'
n_layer = 8
n_embd = 256
n_head = 8
n_kv_head = 8
block_size = 1024
rope = False             # NoPE, as the official recipe: the test rows (48, 64 moves) put the dictionary at
                         # distances never seen in training, where RoPE attention broke on parity (README)
recurrence = 't2mlr'
rec_start = 2
rec_end = 5
train_mode = 'jacobi'
n_iter = 16
n_grad = 4
rec_residual_detach = True   # as the official S5-Retrieval recipe (no gradient through R_{t-1} in m_t)
batch_size = 32
max_iters = 20000
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 1000
eval_interval = 1000
eval_iters = 10
eval_exact_iters = 2
eval_examples = 500
log_interval = 50
