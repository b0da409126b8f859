"""
Where the time goes: the top ops (torch.profiler) of one training forward + backward of each of
bench.py's variants, and of one decode_step (batch 1) of the plain, T2MLR and LRT models, at
bench.py's settings (the shape, the placement, n_iter, n_grad, n_subsets, --device, ...).

    python lab/profile_ops.py --threads=1
    python lab/profile_ops.py --quick=True
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench.py and the model: one folder up
import bench
from bench import sync

results = bench.setup(doc=__doc__)
from torch.profiler import ProfilerActivity, profile

from engine import KVCache

acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if bench.device_type == 'cuda' else [])
sort = 'self_device_time_total' if bench.device_type == 'cuda' else 'self_cpu_time_total'


def show(title, fn):
    with profile(activities=acts) as prof:
        fn()
        sync()
    print(f"\nprofile: {title}")
    print(prof.key_averages().table(sort_by=sort, row_limit=12))


def train_pass(m, mode, rc):
    with bench.ctx:
        loss = m(X, Y, mode=mode, recompute=rc, **kw)[1]
    loss.backward()


X, Y, kw = bench.train_inputs()
for name, rec, mode, rc, *init in bench.TRAIN:
    m = bench.make_model(rec, *init).train()
    train_pass(m, mode, rc)  # warm-up
    show(f"training forward+backward, {name}", lambda: train_pass(m, mode, rc))
models, _ = bench.eval_models()
prompt, toks = bench.decode_inputs(1, 1)
for r, m in models.items():
    cache = KVCache(m.config.n_layer, bench.prompt_len + 1)
    with bench.ctx:
        _, state, _ = m.prefill(prompt, cache, 'exact')
        show(f"one decode_step, batch 1, {bench.NAMES[r]}",
             lambda: m.decode_step(toks[0], range(bench.prompt_len, bench.prompt_len + 1), state, cache))
bench.finish(results)
