# Runs with python lab/train.py config/retrofit_smollm2_gsm8k.py (the research model: prompt masks, rec_lr_mult, ...).
# Retrofit T2MLR into SmolLM2-1.7B-Instruct and fine-tune on GSM8K: the paper's retrofit
# experiment, as far as it can be reconstructed (docs/usage.md, "Retrofit a pretrained
# model", has the paper's numbers and says what is known and what is guessed). One GPU with bf16 (an H100/H200: ~27 GB for fp32
# weights + AdamW, plus activations). Needs internet once (model, tokenizer, data are cached).
#   python prepare.py gsm8k --tokenizer=HuggingFaceTB/SmolLM2-1.7B-Instruct
#   python lab/train.py config/retrofit_smollm2_gsm8k.py
#   python lab/evaluate.py --out_dir=out/retrofit_smollm2_gsm8k --eval_answers=test --max_new_tokens=400 --dtype=bfloat16 --device=cuda
# Control (same recipe, no recurrence): --recurrence=none --train_mode=plain --out_dir=out/smollm2_gsm8k_plain
out_dir = 'out/retrofit_smollm2_gsm8k'
init_from = 'HuggingFaceTB/SmolLM2-1.7B-Instruct'   # 24 layers, d=2048, vocab 49152
dataset = 'gsm8k'
# T2MLR over a middle span of the 24 layers: 0-based 10..14 (1-based 11-15), fused at the input
# of layer 10, state read at the output of layer 14. Five layers (~20% of the depth) centred at
# mid-depth: the same relative placement as the paper's best 135M setting, layers 13-18 of 30
# (40-60% depth, 20% of the layers); the paper found such middle spans beat full-layer recurrence.
recurrence = 't2mlr'
rec_start = 10
rec_end = 14
rec_gate_gain = 1e-2     # xavier gain of the gate weights for fine-tuning (DESIGN.md 3); gates g = 0: identity at init
rec_lr_mult = 100.0      # the new parameters at 100x the backbone's lr
# Jacobi iterations as the official GSM8K recipe: D=16, gradient through the last B=8
# iterations, no gradient through the state's residual. (That recipe also turns the
# residual itself off, which this repo's state always normalises: docs/DESIGN.md,
# "Differences from the official code".)
train_mode = 'jacobi'
n_iter = 16
n_grad = 8
rec_residual_detach = True
# GSM8K train is ~7.3k problems: 32 sequences a step, ~3 epochs
batch_size = 8
gradient_accumulation_steps = 4
max_iters = 700
learning_rate = 1e-5
min_lr = 1e-6
warmup_iters = 20
weight_decay = 0.0
grad_clip = 1.0
dtype = 'bfloat16'
compile = False
# evaluation: exact recurrence is token by token over ~300-token rows, so keep it small here
# and measure answers with lab/evaluate.py --eval_answers=test afterwards
eval_interval = 100
eval_iters = 10
eval_examples = 64
log_interval = 10
