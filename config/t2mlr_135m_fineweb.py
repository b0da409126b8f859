# Runs with python lab/train.py config/t2mlr_135m_fineweb.py (the research model: rope_theta, mlp_hidden, rec_gate_gain).
# T2MLR at the paper's pretraining scale (DESIGN.md 10): SmolLM2-135M shape, middle-layer
# recurrence over layers 13-18 of 30 (1-based; here 0-based 12..17), Jacobi D=16, B=4,
# FineWeb-Edu. The paper's numbers: docs/usage.md, "Paper-scale configs (GPU)".
# GPU. Data: python prepare.py fineweb_edu   (GPT-2 tokenizer, so the vocab is GPT-2's,
# not SmolLM2's 49152; everything else is the SmolLM2-135M shape)
# 8 GPUs: torchrun --standalone --nproc_per_node=8 lab/train.py config/t2mlr_135m_fineweb.py
out_dir = 'out/t2mlr_135m_fineweb'
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
recurrence = 't2mlr'
rec_start = 12
rec_end = 17
rec_gate_gain = 1.0       # the paper's pretraining gain
train_mode = 'jacobi'
n_iter = 16
n_grad = 4
# 8 x 2048 x 64 = ~1M tokens per step (10B tokens = ~9,500 steps), 8 sequences a micro-batch:
# T2MLR keeps 3.3 GiB per 2048-token sequence for backward (lab/memory.py --mem_configs, docs/cost.md),
# so micro-batch 16 is predicted at 67 GiB, tight on an 80 GB GPU once the allocator and kernel
# workspaces (not in the prediction) are added; 8 is predicted at 35 GiB. recompute=True keeps half.
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
