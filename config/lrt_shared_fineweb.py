# Runs with python lab/train.py config/lrt_shared_fineweb.py (the research model: mlp_hidden, rope_theta, lrt_inject).
# LRT-shared at the same SmolLM2-135M shape and data as t2mlr_135m_fineweb.py: memory from
# the upper-middle layer 18 of 30 (0-based 17, about 0.6 L as the paper's 12 of 20), injected
# into every layer through the residual stream and each token's own key/value (one shared
# W_fb pair), trained with interleaved subsets S=2 (about 2x a plain step).
# The paper's numbers: docs/usage.md, "Paper-scale configs (GPU)".
# GPU. Data: python prepare.py fineweb_edu
out_dir = 'out/lrt_shared_fineweb'
dataset = 'fineweb_edu'
n_layer = 30
n_embd = 576
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
n_head = 9
n_kv_head = 3
mlp_hidden = 1536
rope_theta = 100000.0
tie_embeddings = True
block_size = 2048
recurrence = 'lrt'
rec_start = 0
rec_end = 17
lrt_inject = 'both'
lrt_shared = True
train_mode = 'interleaved'
n_subsets = 2
# 8 x 2048 x 64 = ~1M tokens per step (10B tokens = ~9,500 steps), 8 sequences a micro-batch:
# LRT keeps 4.8 GiB per 2048-token sequence for backward (lab/memory.py --mem_configs, docs/cost.md),
# so micro-batch 16 is predicted at 91 GiB, over an 80 GB GPU; 8 is predicted at 46 GiB.
# recompute=True keeps a sixth, and 16 then fits (27 GiB).
batch_size = 8
gradient_accumulation_steps = 64
max_iters = 9500
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 500
weight_decay = 0.1
eval_interval = 500
eval_iters = 40
log_interval = 10
compile = True
