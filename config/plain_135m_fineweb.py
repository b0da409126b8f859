# Runs with python lab/train.py config/plain_135m_fineweb.py (the research model: rope_theta, mlp_hidden).
# The plain GPT baseline for t2mlr_135m_fineweb.py and lrt_shared_fineweb.py: the same
# SmolLM2-135M shape and data, no recurrence.
# GPU. Data: python prepare.py fineweb_edu   (GPT-2 tokenizer, so the vocab is GPT-2's,
# not SmolLM2's 49152; everything else is the SmolLM2-135M shape)
# 8 GPUs: torchrun --standalone --nproc_per_node=8 lab/train.py config/plain_135m_fineweb.py
out_dir = 'out/plain_135m_fineweb'
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
recurrence = 'none'
train_mode = 'plain'
# 16 x 2048 x 32 = ~1M tokens per step; 10B tokens = ~9,500 steps. The plain model keeps 1.9 GiB per
# 2048-token sequence for backward: micro-batch 16 is predicted at 46 GiB (lab/memory.py --mem_configs, docs/cost.md)
batch_size = 16
gradient_accumulation_steps = 32
max_iters = 9500
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 500
weight_decay = 0.1
eval_interval = 500
eval_iters = 40
log_interval = 10
compile = True
