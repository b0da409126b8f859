# Runs with python lab/train.py config/s5_retrieval_s3.py (the research model: rope=False, rec_residual_detach).
# S5-Retrieval at CPU scale, in the official layout (DESIGN.md 11; prepare.py s5_retrieval's default):
# the group S3, one value character per key (k=1), 32 moves in training (rows of 77 tokens: a
# dictionary of 6 keys, '|', 32 moves and their value slots), tested at 48 moves (109 tokens).
# Data: python prepare.py s5_retrieval --group=S3 --k=1
# The official recipe's recurrence at 4 layers instead of 6: from the output of layer L-2 into
# layer 1 (its l_start=1, l_end=-2), Jacobi D=16 < T with gradient through the last B=4, NoPE,
# the state's residual on and detached; a CPU learning rate and batch.
# Baseline: --recurrence=none --train_mode=plain --out_dir=out/s5_retrieval_s3_plain
# It does not learn the task in its 5000 steps (EM 0.00, docs/evidence.md); config/s5_retrieval_2phase_t2mlr.py does.
out_dir = 'out/s5_retrieval_s3'
dataset = 's5_retrieval_S3'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
rope = False
recurrence = 't2mlr'
rec_start = 1
rec_end = 2
rec_residual_detach = True
train_mode = 'jacobi'
n_iter = 16
n_grad = 4
batch_size = 32
max_iters = 5000
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 200
eval_interval = 500
eval_examples = 1000
log_interval = 50
