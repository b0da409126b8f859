# Runs with python lab/train.py config/s5_retrieval_t2mlr.py (the research model: rope=False, mlp_hidden, ...).
# T2MLR on S5-Retrieval (the paper's synthetic benchmark, DESIGN.md 10) with the official recipe's
# settings (princeton-pli/T2MLR scripts/s5_retrieval/train_s5_retrieval.sh; DESIGN.md 11): track a
# running permutation of 5 elements AND copy the 4-character value the in-context dictionary holds
# for each move. Trained on rows of 32 moves (every prefix is labelled), tested at 48 and 64.
# A GPU run; the paper's numbers: docs/usage.md, "Paper-scale configs (GPU)".
# Data: python prepare.py s5_retrieval --group=S5 --k=4    (official layout; rows of 289 tokens)
# Baseline: add --recurrence=none --train_mode=plain --out_dir=out/s5_retrieval_plain
out_dir = 'out/s5_retrieval_t2mlr'
dataset = 's5_retrieval_S5'
n_layer = 6              # the recipe's tinyllama: 6 layers, d=384, 6 heads, MLP 1536 (~10M parameters)
n_embd = 384
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
n_head = 6
n_kv_head = 6
mlp_hidden = 1536
block_size = 1024
rope = False             # NoPE (disable_positional_encoding True)
recurrence = 't2mlr'
rec_start = 1            # l_start=1, l_end=-2: from the output of layer 4 into the input of layer 1
rec_end = 4
rec_gate_gain = 1.0      # gate_weight_init_std 1.0 (a xavier gain), gate bias 0 (sigmoid = 0.5)
rec_residual_detach = True   # residual to the cache on, detached, RMS post-norm
train_mode = 'jacobi'
n_iter = 16              # batch_forward_approximate_depth
n_grad = 4               # batch_backward_approximate_depth
batch_size = 16
max_iters = 400000
learning_rate = 5e-4
min_lr = 5e-6            # cosine to min_lr_rate 0.01
warmup_iters = 20000     # warmup_ratio 0.05
weight_decay = 0.01
dtype = 'bfloat16'
eval_interval = 10000
eval_iters = 10
eval_examples = 1000
log_interval = 100
