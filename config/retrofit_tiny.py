# Runs with python lab/train.py config/retrofit_tiny.py (the research model: prompt masks, rec_lr_mult, rec_gate_gain).
# Retrofit T2MLR into a pretrained Llama and fine-tune it on prompt/response data: the whole
# pipeline of config/retrofit_smollm2_gsm8k.py in miniature, on a 2-core CPU, offline.
# The "pretrained" model is a tiny RANDOM Llama (4 layers, d=64) written by
#   python prepare.py tiny_retrofit_demo
# together with its character tokenizer and the toy task it prepares as data/tiny_sums
# (prompt '3+1+4=\n', response '3 4 8 #### 8': running sums mod 10, answer after '####';
# 1000 distinct prompts: 900 train, 50 val, 50 test, no test prompt seen in training).
# Then:  python lab/train.py config/retrofit_tiny.py
#        python lab/evaluate.py --out_dir=out/retrofit_tiny --eval_answers=test --max_new_tokens=16
# The model starts random, so the learning rate is a
# from-scratch one (3e-3), not the fine-tuning 1e-5 of the real recipe; the rest follows it.
out_dir = 'out/retrofit_tiny'
init_from = 'data/tiny_retrofit_demo/llama'  # a Hugging Face Llama folder (or Hub name)
dataset = 'tiny_sums'
# T2MLR over the middle of the 4 layers (0-based): fused at the input of layer 1, state from layer 2
recurrence = 't2mlr'
rec_start = 1
rec_end = 2
rec_gate_gain = 1e-2     # small gate weights: the fusion starts at identity and stays near it
rec_lr_mult = 10.0       # the new parameters learn faster than the backbone (100 in the real recipe at lr 1e-5)
train_mode = 'jacobi'
n_iter = 8
n_grad = 4
batch_size = 32
max_iters = 800
learning_rate = 3e-3
min_lr = 3e-4
warmup_iters = 20
weight_decay = 0.0
eval_interval = 200
eval_iters = 4
eval_examples = 50
log_interval = 20
