"""
What the latent recurrence costs against the plain GPT of the same backbone, in one run: the training
step (forward + backward + AdamW) of every scheme in TRAIN and decode_step per token, eager and
(--compile=True) compiled, beside the ratios flops.flops_per_token predicts (where they differ, the
gap is not arithmetic). Prints tables, then ONE JSON object on the last line. lab/ runs the rest on
these settings and helpers: prefill.py, hf_peer.py, memory.py, profile_ops.py, plot.py.

    python bench.py                                # CPU, small model, ~2 min on 2 cores
    python bench.py --compile=True --threads=1 --decode_batches=1   # + compiled decode
    python bench.py --device=cuda --compile=True --compile_train=True   # GPU, bf16 autocast
    python bench.py --quick=True --out=bench.json  # tiny model, few reps (tests)
"""

import itertools
import json
import math
import os
import platform
import statistics
import time

from configurator import compile_errors, configure, device_setup, fail
from support.dataset import check_out_file

# -----------------------------------------------------------------------------
# settings: every global below can be set by a config file or --key=value
device = 'cpu'          # 'cpu' | 'cuda' | 'cuda:1' ...
dtype = 'auto'          # 'auto' = bfloat16 autocast on cuda, float32 on cpu | 'float32' | 'bfloat16'
compile = False         # also time the torch.compile'd decode step (engine.py), next to eager
compile_mode = 'default'  # torch.compile mode: 'default' | 'reduce-overhead' (CUDA graphs) | 'max-autotune'
compile_backend = 'inductor'  # 'eager': dynamo tracing only, no code generation (the tests: seconds, not minutes)
compile_train = False   # torch.compile the training forward (slow to warm up; meant for cuda)
threads = 0             # torch CPU threads; 0 = torch's default
seed = 1337             # the weights (the same backbone in every variant) and the random tokens
quick = False           # tiny model and few reps, for the tests (keys set explicitly still win)
n_layer = 8             # the backbone, shared by every variant (an 8.5M-parameter Llama-style GPT)
n_head = 4
n_kv_head = 4
n_embd = 256
vocab_size = 8192       # keeps the LM head at ~1/4 of the forward, about the share it has in SmolLM2-135M
t2mlr_start = -1        # -1: as T2MLR's best 135M setting, layers 13-18 of 30 (1-based), scaled to L layers:
t2mlr_end = -1          #   s = floor(12 L / 30), e = ceil(18 L / 30) - 1  (L=8: blocks 3..4)
lrt_start = 0           # LRT: every block reads the memory
lrt_end = -1            # -1: LRT's source layer sits at ~0.6 L (12 of 20): e = ceil(0.6 L) - 1
n_iter = 8              # 1. training: Jacobi iterations (the papers' D)
n_grad = 4              # Jacobi iterations that carry gradient (B)
n_subsets = 2           # interleaved subsets (S)
batch_size = 4          # sequences a step
seq_len = 128           # tokens a sequence
train_warmup = 2        # untimed steps per variant (allocator, caches, compile)
train_reps = 5          # timed steps per variant; the median is reported
decode_batches = (1, 8)  # 2. decode: the batch sizes
gen_lens = (64, 256)    # tokens decoded after the prompt
prompt_len = 16         # the prompt, prefilled untimed
decode_reps = 3         # timed runs per (batch, length); the median is reported
out = ''                # also write the JSON object to this file

QUICK = dict(n_layer=4, n_head=2, n_kv_head=2, n_embd=64, vocab_size=256, n_iter=4, n_grad=2, n_subsets=2, batch_size=2, seq_len=32,
             train_warmup=1, train_reps=2, decode_batches=(1, 2), gen_lens=(4, 8), prompt_len=8, decode_reps=2)
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (bool, int, float, str, tuple))]


def setup(lab=None, lab_keys=(), lab_quick=None, doc=__doc__, check=lambda: None):
    """The command line into these settings and a lab script's (its globals, keys, --quick values, checks), checked
    before torch is imported (one line, exit 2, in milliseconds); then torch, the device -> the results so far."""
    global dtype, torch, ctx, device_type, placement, CMODE
    g = globals()
    given = {**{k: g[k] for k in config_keys}, **{k: lab[k] for k in lab_keys}}
    set_keys = configure(given, list(given), doc=doc)  # strict: an unknown key or a wrong type is one line
    if given['quick']:
        given.update({k: v for k, v in {**QUICK, **(lab_quick or {})}.items() if k not in set_keys})
    g.update({k: given[k] for k in config_keys})
    for k in lab_keys:
        lab[k] = given[k]
    check_out_file('out', out)
    for k, ok in (('dtype', ('auto', 'float32', 'bfloat16')), ('compile_mode', ('default', 'reduce-overhead', 'max-autotune')),
                  ('compile_backend', ('inductor', 'eager', 'aot_eager'))):
        if g[k] not in ok:
            fail(f"{k}={g[k]!r}: expected {', '.join(map(repr, ok[:-1]))} or {ok[-1]!r}")
    dtype = {'auto': 'bfloat16' if device.startswith('cuda') else 'float32'}.get(dtype, dtype)
    if n_iter < 1 or not 0 <= n_grad <= n_iter or not 1 <= n_subsets <= seq_len:
        fail(f"need n_iter >= 1, 0 <= n_grad <= n_iter, 1 <= n_subsets <= seq_len; got n_iter={n_iter}, "
             f"n_grad={n_grad}, n_subsets={n_subsets}, seq_len={seq_len}")
    at_least(g, batch_size=1, seq_len=1, train_warmup=0, train_reps=1, decode_reps=1, prompt_len=1, vocab_size=1,
             n_layer=1, n_head=1, n_kv_head=1, n_embd=1)
    if not decode_batches or not gen_lens or min(decode_batches + gen_lens) < 1:
        fail("decode_batches and gen_lens must be non-empty tuples of positive ints")
    check()
    import torch
    if device.startswith('cuda') and not torch.cuda.is_available():
        fail(f"device={device!r} but torch.cuda.is_available() is False")
    torch.set_num_threads(threads or torch.get_num_threads())  # 0: torch's default
    device_type, _, ctx = device_setup(device, dtype, seed)
    L = n_layer
    placement = {'none': (0, -1), 'lrt': (lrt_start, math.ceil(0.6 * L) - 1 if lrt_end == -1 else lrt_end),
                 't2mlr': ((12 * L) // 30 if t2mlr_start == -1 else t2mlr_start,
                           math.ceil(18 * L / 30) - 1 if t2mlr_end == -1 else t2mlr_end)}
    CMODE = dict(backend=compile_backend, **({} if compile_mode == 'default' else dict(mode=compile_mode)))
    if compile:  # one compilation per (model, batch, cache length): more than dynamo's default limit of 8
        torch._dynamo.config.recompile_limit = torch._dynamo.config.cache_size_limit = 64
    print(f"bench: device={device} dtype={dtype} compile={compile} threads={torch.get_num_threads()} torch={torch.__version__}")
    print(f"model: n_layer={n_layer} n_embd={n_embd} n_head={n_head} n_kv_head={n_kv_head} vocab={vocab_size}; T2MLR blocks "
          "{}..{}, LRT reads from block {}, source block {}".format(*placement['t2mlr'], *placement['lrt']))
    return dict(config=given, env=dict(
        device=device, dtype=dtype, torch=torch.__version__, python=platform.python_version(), threads=torch.get_num_threads(),
        cpu=platform.processor() or platform.machine(), gpu=torch.cuda.get_device_name(device) if device_type == 'cuda' else None,
        load_avg=list(os.getloadavg()) if hasattr(os, 'getloadavg') else None))  # on a loaded machine times are noisy

# -----------------------------------------------------------------------------
# helpers (lab/ uses them too)

def at_least(g, **lows):
    for k, low in lows.items():
        if not g[k] >= low:  # (nan fails too)
            fail(f"{k}={g[k]} must be >= {low}")

def sync():
    if device_type == 'cuda':  # CUDA kernels run asynchronously: a timer must wait for them, at both ends
        torch.cuda.synchronize()

def make_model(rec, jacobi_init='plain', block_size=0):
    """The backbone with recurrence rec at its placement, the same weights in every variant."""
    from lab.model_full import GPT, GPTConfig
    torch.manual_seed(seed)
    s, e = placement[rec]
    try:
        cfg = GPTConfig(block_size=max(block_size, seq_len, prompt_len + max(gen_lens)), vocab_size=vocab_size,
                        n_layer=n_layer, n_head=n_head, n_kv_head=n_kv_head, n_embd=n_embd, recurrence=rec,
                        rec_start=s, rec_end=e, jacobi_init=jacobi_init)
    except ValueError as err:
        fail(str(err))
    return GPT(cfg).to(device)

NAMES = {'none': 'plain', 't2mlr': 't2mlr', 'lrt': 'lrt'}

def eval_models(block_size=0):
    """plain, T2MLR and LRT for inference, and (--compile=True) their engines: engine.py's compiled steps."""
    from engine import Engine
    models = {rec: make_model(rec, block_size=block_size).eval() for rec in NAMES}
    return models, {r: Engine(m, CMODE) for r, m in models.items()} if compile else {}

med = statistics.median

def count_ops(fn):
    """ATen ops fn() dispatches: on a small model each costs ~Python + dispatch overhead, whatever its size."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        n = 0
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.n += 1
            return func(*args, **(kwargs or {}))
    with Counter():
        fn()
    return Counter.n

def round_robin(runs, warmup, reps):
    """{key: fn() -> seconds} -> {key: [seconds]} of reps rounds after warmup untimed ones (the first compiles).
    Round-robin (a, b, a, b), not a, a, b, b: the load of a shared machine drifts, and this spreads it."""
    times = {k: [] for k in runs}
    for rep in range(warmup + reps):
        for k, run in runs.items():
            with compile_errors():  # a compiler that fails on this machine: one line
                dt = run()
            if rep >= warmup:
                times[k].append(dt)
    return times

def table(rows, cols):
    """Prints rows (dicts); cols: (header, key or fn(row), format spec); None prints as -."""
    widths = [int(spec.lstrip('<>').split('.')[0].rstrip('d')) for _, _, spec in cols]
    print(' '.join(f"{h:{'<' if s[0] == '<' else '>'}{w}}" for (h, _, s), w in zip(cols, widths)))
    for r in rows:
        vals = [k(r) if callable(k) else r.get(k) for _, k, _ in cols]  # (None: '-')
        print(' '.join('-'.rjust(w) if v is None else format(v, s) for v, (_, _, s), w in zip(vals, cols, widths)))

def finish(results):
    line = json.dumps(results, default=float)
    if out:
        with open(out, 'w') as f:
            f.write(line + '\n')
    print(line)  # the last line of stdout

# -----------------------------------------------------------------------------
# 1. training step: forward(mode) + backward + AdamW, the same batch for every variant

TRAIN = [  # (name, recurrence, mode, activation checkpointing[, Jacobi's first guess: 'exact' = the exact states])
    ('plain', 'none', 'plain', False), ('t2mlr+jacobi', 't2mlr', 'jacobi', False),
    ('t2mlr+jacobi-exact', 't2mlr', 'jacobi', False, 'exact'), ('lrt+interleaved', 'lrt', 'interleaved', False),
    ('t2mlr+interleaved', 't2mlr', 'interleaved', False), ('lrt+jacobi', 'lrt', 'jacobi', False),
    ('t2mlr+jacobi+rc', 't2mlr', 'jacobi', True), ('lrt+interleaved+rc', 'lrt', 'interleaved', True)]

def train_inputs():
    """The batch every variant trains on, and the scheme's iteration counts."""
    data = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=torch.Generator().manual_seed(seed)).to(device)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous(), dict(n_iter=n_iter, n_grad=n_grad, n_subsets=n_subsets)

def train_section():
    from support.flops import flops_per_token
    X, Y, kw = train_inputs()
    print(f"\n1. training step: batch {batch_size} x {seq_len}, n_iter={n_iter} n_grad={n_grad} n_subsets={n_subsets}, {train_warmup} warm-up + {train_reps} timed steps")
    variants = []
    for name, rec, mode, rc, *init in TRAIN:
        m = make_model(rec, *init).train()
        opt = torch.optim.AdamW(m.param_groups(0.1), lr=1e-4, betas=(0.9, 0.95),  # as train.py builds it
                                **(dict(fused=True) if device_type == 'cuda' else {}))
        fwd = torch.compile(m) if compile_train else m
        variants.append(dict(name=name, rec=rec, mode=mode, recompute=rc, model=m, opt=opt, fwd=fwd))
    def step(v):
        sync()
        t0 = time.perf_counter()
        with ctx:
            _, loss = v['fwd'](X, Y, mode=v['mode'], recompute=v['recompute'], **kw)
        loss.backward()
        v['opt'].step()
        v['opt'].zero_grad(set_to_none=True)
        sync()
        v['loss'] = loss
        return time.perf_counter() - t0
    times = round_robin({v['name']: (lambda v=v: step(v)) for v in variants}, train_warmup, train_reps)
    plain_flops, plain_t, rows = flops_per_token(variants[0]['model'].config, seq_len, 'plain'), med(times['plain']), []
    for v in variants:
        m, ts = v['model'], times[v['name']]
        fl, t = flops_per_token(m.config, seq_len, v['mode'], **kw), med(ts)
        rows.append(dict(name=v['name'], recurrence=v['rec'], mode=v['mode'], step_ms=1e3 * t, step_ms_min=1e3 * min(ts),
                         step_ms_max=1e3 * max(ts), tokens_per_s=batch_size * seq_len / t, flops_per_token=fl,
                         achieved_gflops=fl * batch_size * seq_len / t / 1e9, flop_ratio=fl / plain_flops,
                         loss=v['loss'].item(), n_params=sum(p.numel() for p in m.parameters()), ratio=t / plain_t,
                         ratio_over_flops=t / plain_t / (fl / plain_flops)))  # > 1: slower than the arithmetic explains
    table(rows, [('variant', 'name', '<19'), ('ms/step', 'step_ms', '9.1f'), ('tok/s', 'tokens_per_s', '9.0f'),
                 ('ratio', 'ratio', '6.2f'), ('FLOPs', 'flop_ratio', '6.2f'), ('GFLOP/s', 'achieved_gflops', '8.2f')])
    print("  ratio: step time / plain's; FLOPs: flops_per_token's ratio; +rc: recompute=True; memory: lab/memory.py")
    return rows

# -----------------------------------------------------------------------------
# 2. decode: time decode_step only (no sampling, no prefill), one call per token

def decode_inputs(bsz, n_gen):
    """The prompt and n_gen input tokens ((bsz, 1) each): fixed random ones (no sampling op in the time)."""
    x = torch.randint(0, vocab_size, (bsz, prompt_len + n_gen), generator=torch.Generator().manual_seed(seed)).to(device)
    return x[:, :prompt_len].contiguous(), [x[:, t:t + 1].contiguous() for t in range(prompt_len, prompt_len + n_gen)]

def decode_run(m, step, prompt, toks, compiled, ops=False):
    """Prefill the prompt (untimed), then time one call of step (m.decode_step, or an engine's over a
    static cache) per token -> seconds per token; ops=True: the ATen ops of the first call instead."""
    from engine import KVCache, StaticKVCache
    cache = (StaticKVCache if compiled else KVCache)(m.config.n_layer, prompt_len + len(toks))
    span = range(prompt_len, prompt_len + len(toks))  # the compiled step reads its position as a tensor
    pos = [torch.tensor([t], device=device) if compiled else range(t, t + 1) for t in span]
    with ctx:
        _, state, _ = m.prefill(prompt, cache, 'exact')
        if ops:
            return count_ops(lambda: step(toks[0], pos[0], state, cache))
        sync()
        t0 = time.perf_counter()
        for tok, p in zip(toks, pos):
            _, state = step(tok, p, state, cache)  # (a CUDA graph's output: cloned)
        sync()
    return (time.perf_counter() - t0) / len(toks)

def decode_section(models, engines):  # -> eager rows, compiled rows (each against plain, compiled: COMPILED plain)
    from support.flops import flops_per_token
    print(f"\n2. decode: prompt {prompt_len}, decode_step only, median of {decode_reps} runs, round-robin")
    rows = {'eager': [], 'compiled': []}
    for bsz, n_gen in itertools.product(decode_batches, gen_lens):
        prompt, toks = decode_inputs(bsz, n_gen)
        steps = {**{(r, 'eager'): m.decode_step for r, m in models.items()},
                 **{(r, 'compiled'): e.decode_step for r, e in engines.items()}}
        times = round_robin({k: (lambda k=k: decode_run(models[k[0]], steps[k], prompt, toks, k[1] == 'compiled'))
                             for k in steps}, 1, decode_reps)  # the warm-up run compiles
        t = {k: med(ts) for k, ts in times.items()}
        ctx_len = prompt_len + n_gen / 2  # the mean context a decoded token attends over
        fl = {r: flops_per_token(m.config, ctx_len, 'exact', train=False) for r, m in models.items()}
        ops = {r: decode_run(m, m.decode_step, prompt, toks, False, ops=True) for r, m in models.items()}
        for (r, kind), tk in t.items():
            ratio, flop_ratio = tk / t[('none', kind)], fl[r] / fl['none']
            rows[kind].append(dict(model=NAMES[r], batch=bsz, gen_len=n_gen, ms_per_token=1e3 * tk, tokens_per_s=bsz / tk,
                                   flop_ratio=flop_ratio, ratio=ratio, ratio_over_flops=ratio / flop_ratio,
                                   **(dict(ops_per_token=ops[r], ops_ratio=ops[r] / ops['none'], us_per_op=1e6 * tk / ops[r])
                                      if kind == 'eager' else dict(mode=compile_mode, speedup_over_eager=t[(r, 'eager')] / tk))))
    cols = [('model', 'model', '<7'), ('batch', 'batch', '5d'), ('gen', 'gen_len', '5d'), ('ms/tok', 'ms_per_token', '8.3f'),
            ('tok/s', 'tokens_per_s', '9.1f'), ('ratio', 'ratio', '6.3f'), ('FLOPs', 'flop_ratio', '6.3f')]
    table(rows['eager'], cols + [('ops/tok', 'ops_per_token', '8d'), ('ops x', 'ops_ratio', '6.3f'),
                                 ('us/op', 'us_per_op', '6.1f')])
    print("  FLOPs at the mean context; ops: ATen ops per decode_step (where ops rule, ratio follows ops x, not FLOPs)")
    if engines:
        print(f"compiled (torch.compile'd decode_step, mode {compile_mode}; ratio: to COMPILED plain)")
        table(rows['compiled'], cols + [('speedup', 'speedup_over_eager', '7.2f')])
    return rows['eager'], rows['compiled']

if __name__ == '__main__':
    results = setup()
    results['train'] = train_section()
    models, engines = eval_models()
    from support.flops import rec_flops
    results['models'] = {NAMES[r]: dict(recurrence=r, rec_start=placement[r][0] if r != 'none' else None,
                                        rec_end=placement[r][1] if r != 'none' else None, rec_flops_per_token=rec_flops(m.config),
                                        n_params=sum(p.numel() for p in m.parameters())) for r, m in models.items()}
    results['decode'], results['decode_compiled'] = decode_section(models, engines)
    finish(results)
