"""
The prefill of a prompt against the plain model's, beside the FLOP model: prefill_len tokens into an
empty cache through the plain, the exact and the k-iteration Jacobi prefill, and the Jacobi prefill
to tolerance (exact to prefill_tol); with --compile=True also the exact prefill with compiled span
steps, against the compiled plain prefill; with --prefill_ckpt a trained model too. The models and
the settings are bench.py's (the shape, the placement, n_iter, --compile, --out, ...), plus those below.

    python lab/prefill.py --compile=True --threads=1 --prefill_ckpt=out/compare_Z2/t2mlr_full_w32_s1/ckpt.pt
    python lab/prefill.py --quick=True
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench.py and the model: one folder up
import bench
from bench import med, round_robin, sync, table
from configurator import fail

# -----------------------------------------------------------------------------
# settings of this script (bench.py's apply too)
prefill_len = 128       # the prompt's tokens
prefill_batch = 1       # prompts at once
prefill_iters = -1      # k of the Jacobi prefill; -1 = n_iter
prefill_tol = 1e-4      # the Jacobi prefill to tolerance: iterate until no state moves by more than this
prefill_ckpt = ''       # also time the prefills on this trained checkpoint (prompts: random ids of its vocabulary)
prefill_reps = 5        # timed rounds; the median is reported
# -----------------------------------------------------------------------------
ckpt_model = None


def check():
    """This script's settings, before the timing (the checkpoint is loaded here: one it cannot run
    fails in seconds, with nothing printed)."""
    global prefill_iters, ckpt_model
    bench.at_least(globals(), prefill_len=1, prefill_batch=1, prefill_reps=1, prefill_tol=0)
    if prefill_iters == -1:
        prefill_iters = bench.n_iter
    bench.at_least(globals(), prefill_iters=1)
    if prefill_ckpt:
        from support.checkpoint import CheckpointError, load_checkpoint
        if not os.path.isfile(prefill_ckpt):
            fail(f"prefill_ckpt={prefill_ckpt}: no such file")
        try:
            ckpt_model = load_checkpoint(prefill_ckpt, bench.device)[0].eval()
        except CheckpointError as e:
            fail(str(e))
        if getattr(ckpt_model.config, 'arch', 'gpt') == 'lstm':
            fail(f"prefill_ckpt={prefill_ckpt} is an LSTM: it has no prefill modes to time (its prompt always runs exactly)")


results = bench.setup(globals(), ['prefill_len', 'prefill_batch', 'prefill_iters', 'prefill_tol', 'prefill_ckpt', 'prefill_reps'],
                      dict(prefill_len=16, prefill_reps=2), __doc__, check)
import torch
from engine import KVCache, StaticKVCache
from support.flops import flops_per_token

print(f"\nprefill: batch {prefill_batch} x {prefill_len} tokens, Jacobi k={prefill_iters} and to tolerance "
      f"{prefill_tol:g}, median of {prefill_reps} runs, round-robin")
models, engines = bench.eval_models(block_size=prefill_len)
names = dict(bench.NAMES, ckpt='ckpt')
g = torch.Generator().manual_seed(bench.seed)
prompts = dict.fromkeys(models, torch.randint(0, bench.vocab_size, (prefill_batch, prefill_len), generator=g).to(bench.device))
CASES = [('none', 'plain')] + [(r, mode) for r in ('t2mlr', 'lrt') for mode in ('plain', 'exact', 'jacobi', 'jacobi-tol')]
if ckpt_model is not None:  # a trained model: random ids of its vocabulary are inputs of the s5 tasks (parity, S3)
    c = ckpt_model.config
    models['ckpt'] = ckpt_model
    prompts['ckpt'] = torch.randint(0, c.vocab_size, (prefill_batch, min(prefill_len, c.block_size)), generator=g).to(bench.device)
    CASES += [('ckpt', mode) for mode in ('plain', 'exact', 'jacobi', 'jacobi-tol')]
if engines:  # the exact prefill's span steps compiled (engine.py); and the plain prefill compiled whole, its peer
    CASES += [('none', 'plain-compiled'), ('t2mlr', 'exact-compiled'), ('lrt', 'exact-compiled')]
    plain_prefill_compiled = torch.compile(models['none'].prefill, dynamic=False, **bench.CMODE)
passes = {}  # span passes a prefill took


def prefill_run(r, mode):
    m, prompt = models[r], prompts[r]
    cache = (StaticKVCache if mode == 'exact-compiled' else KVCache)(m.config.n_layer, prompt.size(1))
    with bench.ctx:
        sync()
        t0 = time.perf_counter()
        if mode == 'plain-compiled':
            plain_prefill_compiled(prompt, cache, 'plain')
        elif mode == 'exact-compiled':
            engines[r].prefill(prompt, cache, 'exact')
        else:
            passes[(r, mode)] = m.prefill(prompt, cache, mode.removesuffix('-tol'), n_iter=prefill_iters,
                                          tol=prefill_tol if mode == 'jacobi-tol' else None)[2]
        sync()
    return time.perf_counter() - t0


times = round_robin({c: (lambda c=c: prefill_run(*c)) for c in CASES}, 1, prefill_reps)  # the first round compiles
rows = []
for r, mode in CASES:
    m, t, T = models[r], med(times[(r, mode)]), prompts[r].size(1)
    n = passes.get((r, mode), 0) - 1 if mode == 'jacobi-tol' else prefill_iters  # its n_iter
    fl = flops_per_token(m.config, T, mode.removesuffix('-compiled').removesuffix('-tol'), n_iter=max(n, 1),
                         n_grad=0, train=False)
    rows.append(dict(model=names[r], mode=mode, n_iter=n if mode.startswith('jacobi') else None,
                     span_passes=passes.get((r, mode)), prompt_len=T, batch=prefill_batch, ms=1e3 * t,
                     tokens_per_s=prefill_batch * T / t, flop_ratio=fl / flops_per_token(m.config, T, 'plain', train=False)))
for row in rows:
    base = 'ckpt' if row['model'] == 'ckpt' else 'plain'  # the plain prefill of the same backbone
    row['ratio'] = row['ms'] / next(x['ms'] for x in rows if (x['model'], x['mode']) == (base, 'plain'))
    row['ratio_over_flops'] = row['ratio'] / row['flop_ratio']
    if row['mode'].endswith('-compiled'):  # against the compiled plain prefill
        row['ratio_to_plain_compiled'] = row['ms'] / next(x['ms'] for x in rows if x['mode'] == 'plain-compiled')
table(rows, [('model', 'model', '<7'), ('mode', 'mode', '<14'), ('T', 'prompt_len', '5d'), ('ms', 'ms', '9.2f'),
             ('tok/s', 'tokens_per_s', '9.0f'), ('ratio', 'ratio', '7.2f'), ('FLOPs', 'flop_ratio', '6.2f'),
             ('passes', 'span_passes', '7d'), ('x compiled plain', 'ratio_to_plain_compiled', '16.2f')])
print("  ratio = x the plain prefill of the same backbone; exact runs the span token by token (its cost is latency, "
      "not FLOPs); jacobi-tol iterates until no state moves by more than prefill_tol (passes: span passes it took)")
results['prefill'] = rows
bench.finish(results)
