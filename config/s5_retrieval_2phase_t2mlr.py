# Runs with python lab/train.py (the research model): S5-Retrieval's dictionary is read with the recurrence off (a prompt mask).
# T2MLR on S5-Retrieval in the official layout (DESIGN.md 11; config/s5_retrieval_s3.py's rows: the
# group S3, one value character per key, 32 moves in training, tested at 48 and 64), in two phases.
# At each move the label is the running product of the moves so far (the state), at the slot after
# it the value the dictionary holds for that move: a lookup one token after its key (the hop), which
# no model found from these labels alone (docs/evidence.md, "What blocks the lookup"). Phase 1 asks
# each value at its move as well, which a GPT learns at once, and the slot's lookup comes with it;
# phase 2 trains on the official labels, where the state is learned and the lookup kept.
# Data: python prepare.py s5_retrieval --group=S3 --k=1 && python lab/relabel.py s5_retrieval_S3 --phase1=True
# Phase 1: python lab/train.py config/s5_retrieval_2phase_t2mlr.py --dataset=phase1/s5_retrieval_S3 --max_iters=1000
# Phase 2: python lab/train.py config/s5_retrieval_2phase_t2mlr.py --init_from=resume
# The recipe of config/s5_retrieval_swap_t2mlr.py (exact training, the recurrent gate open at init,
# 2e-3 after 50 warmup steps), one schedule over both phases.
out_dir = 'out/s5_retrieval_2phase_t2mlr'
dataset = 's5_retrieval_S3'
n_layer = 4
n_head = 4
n_kv_head = 4
n_embd = 64
vocab_pad = 128          # the embedding rows rounded up to a multiple of 128 (fast LM-head GEMMs; never sampled)
recurrence = 't2mlr'
rec_start = 0            # the state enters block 0 ...
rec_end = 3              # ... from the output of the last block
rec_gate_init = 1.0      # g_rec = 1 at init: the recurrent path open from the start
train_mode = 'interleaved'
n_subsets = 77           # S = T (77 tokens a row): every token reads its exact state, the gradient through the whole chain
batch_size = 32
max_iters = 3000
lr_decay_iters = 3000    # set, not -1: phase 1 stops at step 1000 of this one schedule
learning_rate = 2e-3
min_lr = 2e-4
warmup_iters = 50
eval_interval = 250
eval_examples = 1000
log_interval = 50
