# Runs with python lab/train.py (the research model): S5-Retrieval's dictionary is read with the recurrence off (a prompt mask).
# LRT on S5-Retrieval in the official layout, in two phases: config/s5_retrieval_2phase_t2mlr.py's
# rows, schedule and exact phase 2, with LRT's memory (from block 2, into every block's residual
# stream and keys/values) in place of T2MLR's fusion. Phase 1 runs on Jacobi with D = 2: a guess
# of the memory (phase 1 labels no state) and the gradient one step back along the chain, not
# through it. On the exact chain LRT did not find phase 1's lookup (0 of 6 runs), with the cut it
# did on 4 of 5 seeds (docs/evidence.md).
# Data: python prepare.py s5_retrieval --group=S3 --k=1 && python lab/relabel.py s5_retrieval_S3 --phase1=True
# Phase 1: python lab/train.py config/s5_retrieval_2phase_lrt.py --dataset=phase1/s5_retrieval_S3 --max_iters=1000 \
#              --train_mode=jacobi --n_iter=2 --n_grad=1
# Phase 2: python lab/train.py config/s5_retrieval_2phase_lrt.py --init_from=resume
out_dir = 'out/s5_retrieval_2phase_lrt'
dataset = 's5_retrieval_S3'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
recurrence = 'lrt'
rec_start = 0            # the memory enters every block ...
rec_end = 2              # ... from the output of block 2 (config/s3_lrt.py's)
train_mode = 'interleaved'
n_subsets = 77           # S = T (77 tokens a row): every token reads its exact memory, the gradient through the whole chain
batch_size = 32
max_iters = 3000
lr_decay_iters = 3000    # set, not -1: phase 1 stops at step 1000 of this one schedule
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 50
eval_interval = 250
eval_examples = 1000
log_interval = 50
