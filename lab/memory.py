"""
Memory, beside bench.py's times:

  1. bench.py's training variants: the bytes autograd saves for backward in one training forward
     (per trained token, and against plain's), and on cuda the peak of one training step
  2. --mem_configs: a training config at its own size (e.g. config/lrt_shared_fineweb.py): the bytes
     saved for backward per sequence, measured on this device at batch 1 and 2 under bf16 autocast,
     and the peak predicted at its micro-batch, held against a GPU's memory

bench.py's settings apply (the shape, the placement, n_iter, n_grad, n_subsets, --device, --out, ...), plus those below.

    python lab/memory.py --threads=1
    python lab/memory.py --threads=1 --mem_len=256 \\
        --mem_configs=config/plain_135m_fineweb.py,config/t2mlr_135m_fineweb.py,config/lrt_shared_fineweb.py
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench.py and the model: one folder up
import bench
from bench import table
from configurator import fail, read_config

# -----------------------------------------------------------------------------
# settings of this script (bench.py's apply too)
mem_configs = ''        # 2. training configs, comma-separated (e.g. config/lrt_shared_fineweb.py)
mem_vocab = 50257       # those configs' vocabulary (the 135M configs train on GPT-2 tokens)
mem_gpu_gib = 80.0      # the GPU memory the prediction is held against
mem_len = 0             # > 0: measure at this many tokens a sequence and scale the bytes per token to the
                        # config's block_size (2 x 2048 tokens of LRT do not fit a 24 GB CPU machine)
# -----------------------------------------------------------------------------


def check():
    bench.at_least(globals(), mem_vocab=1, mem_len=0)
    if not mem_gpu_gib > 0:
        fail(f"mem_gpu_gib={mem_gpu_gib} must be > 0")
    for path in filter(None, mem_configs.split(',')):
        if not os.path.isfile(path):
            fail(f"mem_configs: no config file {path}")


results = bench.setup(globals(), ['mem_configs', 'mem_vocab', 'mem_gpu_gib', 'mem_len'], None, __doc__, check)
import torch
from lab.model_full import GPT, GPTConfig
from support.diagnostics import activation_bytes


def mb(nbytes):
    return None if nbytes is None else round(nbytes / 2**20, 2)


def saved_bytes(m, x, y, **scheme):
    """Bytes autograd saves for backward in one training forward (per storage; the parameters and
    buffers, e.g. the RoPE tables, are not activations; under autocast the low-precision weight copies count)."""
    return activation_bytes(lambda: m(x, y, **scheme), (*m.parameters(), *m.buffers()))


def step_peak(m, x, y, **scheme):
    """cuda: the most one training step (forward, backward, AdamW) allocates on top of what was allocated
    before it: activations, gradients, temporaries. The second step's (the first allocates AdamW's state)."""
    opt = torch.optim.AdamW(m.param_groups(0.1), lr=1e-4, fused=True)
    for _ in range(2):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(bench.device)
        torch.cuda.reset_peak_memory_stats(bench.device)
        with bench.ctx:
            loss = m(x, y, **scheme)[1]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return torch.cuda.max_memory_allocated(bench.device) - base


X, Y, kw = bench.train_inputs()
print(f"\n1. memory of bench.py's training variants: batch {bench.batch_size} x {bench.seq_len} tokens, "
      f"n_iter={bench.n_iter} n_grad={bench.n_grad} n_subsets={bench.n_subsets}")
rows = []
for name, rec, mode, rc, *init in bench.TRAIN:
    m = bench.make_model(rec, *init).train()
    with bench.ctx:
        act = saved_bytes(m, X, Y, mode=mode, recompute=rc, **kw)
    peak = step_peak(m, X, Y, mode=mode, recompute=rc, **kw) if bench.device_type == 'cuda' else None
    rows.append(dict(name=name, recurrence=rec, mode=mode, act_mem_mb=mb(act), act_bytes_per_token=act / X.numel(),
                     step_peak_mem_mb=mb(peak)))
for r in rows:
    r['act_mem_ratio'] = r['act_mem_mb'] / rows[0]['act_mem_mb'] if rows[0]['act_mem_mb'] else None
table(rows, [('variant', 'name', '<19'), ('act MB', 'act_mem_mb', '7.1f'),
             ('KB/tok', lambda r: r['act_bytes_per_token'] / 1024, '7.1f'), ('act x', 'act_mem_ratio', '6.2f'),
             ('peak MB', 'step_peak_mem_mb', '8.1f')])
print("  act MB = tensors saved for backward (KB/tok: per trained token; act x: against plain's); +rc = activation "
      "checkpointing (recompute=True); peak MB = cuda max_memory_allocated during a step (cuda only)")
results['train_memory'] = rows


def config_memory(path):
    """A train config's model and scheme (model fields: GPTConfig's defaults where the file is
    silent; the scheme: train.py's) at batch 1 and 2 of its block_size, bf16 autocast as on a GPU:
    the bytes saved for backward per sequence (slope) and per step (intercept: the bf16 weight
    copies), and the peak predicted at its micro-batch: fp32 weights, gradients and AdamW (16 bytes
    a parameter), the saved activations, and the fp32 logit gradient of backward."""
    ns = read_config(path)
    scheme = dict(mode=ns.get('train_mode', 'jacobi'), n_iter=ns.get('n_iter', 8), n_grad=ns.get('n_grad', 4),
                  n_subsets=ns.get('n_subsets', 2), n_rounds=ns.get('n_rounds', 1), block_len=ns.get('block_len', 1),
                  recompute=ns.get('recompute', False))
    args = {k: ns[k] for k in GPTConfig.__dataclass_fields__ if k in ns}
    args.update(vocab_size=mem_vocab, reset_token=None)
    torch.manual_seed(bench.seed)
    m = GPT(GPTConfig(**args)).to(bench.device).train()
    T, mb_size = m.config.block_size, ns.get('batch_size', 32)
    n = mem_len or T  # tokens per measured sequence
    saved = []
    for b in (1, 2):
        x = torch.randint(0, mem_vocab, (b, n), device=bench.device)
        with torch.autocast(bench.device_type, dtype=torch.bfloat16):
            saved.append(saved_bytes(m, x, x, **scheme))
    per_seq, per_step = (saved[1] - saved[0]) * T / n, 2 * saved[0] - saved[1]  # bytes per token: the same at any T
    n_params = sum(p.numel() for p in m.parameters())
    peak = 16 * n_params + per_step + per_seq * mb_size + 2 * 4 * mb_size * T * m.config.padded_vocab
    return dict(config=path, mode=scheme['mode'], recompute=scheme['recompute'], block_size=T, measured_len=n, micro_batch=mb_size,
                n_params=n_params, saved_gib_per_seq=per_seq / 2**30, saved_bytes_per_token=per_seq / T,
                predicted_peak_gib=peak / 2**30, fits=peak / 2**30 < 0.9 * mem_gpu_gib)


if mem_configs:
    print(f"\n2. memory at the configs' size (bf16 autocast on {bench.device}; predicted peak held against {mem_gpu_gib:g} GiB)")
    results['memory'] = []
    for path in filter(None, mem_configs.split(',')):
        r = config_memory(path)
        results['memory'].append(r)
        print(f"  {path}: {r['mode']}{' +recompute' if r['recompute'] else ''}, saved {r['saved_gib_per_seq']:.2f} GiB per "
              f"{r['block_size']}-token sequence ({r['saved_bytes_per_token'] / 1024:.0f} KB/token); micro-batch "
              f"{r['micro_batch']}: predicted peak {r['predicted_peak_gib']:.1f} GiB"
              + ('' if r['fits'] else f"  > 90% of {mem_gpu_gib:g} GiB: lower batch_size"), flush=True)
bench.finish(results)
