"""
train.py with the research model (lab/model_full.py): every field of its GPTConfig is a setting too
(rope, rope_theta, mlp_hidden, dropout, tie_embeddings, rec_residual_detach, rec_gate_gain, rec_scale_min/max,
lrt_inject, ..., and its training options n_rounds, block_len, train_mode='block', recompute, rec_lr_mult,
arch='lstm'), prompt/response data trains, and its checkpoints hold the research model's args.

$ python lab/train.py config/s3_lstm.py
$ torchrun --standalone --nproc_per_node=2 lab/train.py config/s5_retrieval_s3.py

train.py imports `model`: here that name is lab/model_full.py (which builds on model.py itself, imported first).
"""

import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo root: its modules are top level
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
import model  # noqa: E402  (the textbook model, which lab/model_full.py imports as `model`)
import lab.model_full  # noqa: E402

sys.modules['model'] = lab.model_full
try:
    runpy.run_path(os.path.join(ROOT, 'train.py'), run_name='__main__')
finally:  # (a test that runs this in its own process gets the textbook model back)
    sys.modules['model'] = model
