"""
What the latent recurrence costs, against the plain GPT, in one run:

  1. training step  forward(mode) + backward + AdamW, for plain, T2MLR+Jacobi(D, B),
                    LRT+interleaved(S) and the two cross pairings
  2. decode         per-token latency of decode_step with the KV cache, eager and (with
                    --compile=True) torch.compile'd; HF LlamaForCausalLM.generate at the
                    same shape and weights as a peer row when transformers is installed
  3. prefill        a prompt through the plain, exact and k-iteration Jacobi prefill (and
                    the exact prefill with compiled span steps)

Every model is built from the SAME GPTConfig shape, only `recurrence` (and its
placement) changes, so every ratio is "same backbone, recurrence on / off". Next to
each measured ratio stands the ratio flops.flops_per_token predicts: where the two
differ, the gap is not arithmetic (Python dispatch, sequential execution, memory).

    python bench.py                                # CPU, small model, < 3 min on 2 cores
    python bench.py --compile=True --threads=1 --decode_batches=1   # + compiled decode/prefill
    python bench.py --device=cuda --compile=True --compile_train=True   # GPU, bf16 autocast
    python bench.py config/my_bench.py --D=16 --out=bench.json --plot=bench.png
    python bench.py --quick=True                   # tiny model, few reps (tests)

Prints readable tables, then ONE JSON object with every figure on the last line.
"""

import json
import math
import os
import platform
import statistics
import sys
import time

from configurator import check_out_file, compile_errors, configure, device_setup, fail, read_config

# -----------------------------------------------------------------------------
# config: every global below can be set by a config file or --key=value
device = 'cpu'          # 'cpu' | 'cuda' | 'cuda:1' ...
dtype = 'auto'          # 'auto' = bfloat16 autocast on cuda, float32 on cpu | 'float32' | 'bfloat16'
compile = False         # also time the torch.compile'd decode step and exact prefill, next to eager
compile_mode = 'default'  # torch.compile mode of those: 'default' | 'reduce-overhead' (CUDA graphs) | 'max-autotune'
compile_backend = 'inductor'  # 'eager': dynamo tracing only, no code generation (the tests: seconds, not minutes)
compile_train = False   # torch.compile the training forward (slow to warm up; meant for cuda)
hf_peer = True          # time HF LlamaForCausalLM.generate at the same shape and weights (needs transformers)
threads = 0             # torch CPU threads; 0 = torch's default
seed = 1337
quick = False           # tiny model and few reps, for the tests (keys set explicitly still win)
# the backbone, shared by every variant (an 8.5M-parameter Llama-style GPT)
n_layer = 8
n_head = 4
n_kv_head = 4
n_embd = 256
vocab_size = 8192       # keeps the LM head at ~1/4 of the forward, about the share it has in SmolLM2-135M
# recurrence placement; -1 = scaled from the papers
t2mlr_start = -1        # T2MLR's best 135M setting recurs over layers 13-18 of 30 (1-based):
t2mlr_end = -1          #   s = floor(12 L / 30), e = ceil(18 L / 30) - 1  (L=8: blocks 3..4)
lrt_start = 0           # LRT: every block reads the memory
lrt_end = -1            # LRT's source layer sits at ~0.6 L (12 of 20): e = ceil(0.6 L) - 1
# 1. training
D = 8                   # Jacobi iterations (d_forward)
B = 4                   # Jacobi iterations that carry gradient (d_backward)
S = 2                   # interleaved subsets
batch_size = 4
seq_len = 128
train_warmup = 2        # untimed steps per variant (allocator, caches, compile)
train_reps = 5          # timed steps per variant; the median is reported
learning_rate = 1e-4
weight_decay = 0.1
# 2. decode
decode_batches = (1, 8)
gen_lens = (64, 256)    # tokens decoded after the prompt
prompt_len = 16
decode_reps = 3
# 3. prefill
prefill_len = 128
prefill_batch = 1
prefill_iters = -1      # k of the Jacobi prefill; -1 = D
prefill_tol = 1e-4      # the Jacobi prefill to tolerance: iterate until no state moves by more than this
prefill_ckpt = ''       # also time the prefills on this trained checkpoint (prompts: random ids of its vocabulary)
prefill_reps = 5
# 4. memory at a training config's size (e.g. config/lrt_shared_fineweb.py; comma-separated): bytes
# saved for backward per sequence, measured on this device at batch 1 and 2, and the peak predicted at its batch
mem_configs = ''
mem_vocab = 50257       # those configs' vocabulary (the 135M configs train on GPT-2 tokens)
mem_gpu_gib = 80.0      # the GPU memory the prediction is held against
mem_len = 0             # > 0: measure at this many tokens a sequence and scale the bytes per token to the
                        # config's block_size (2 x 2048 tokens of LRT do not fit a 24 GB CPU machine)
memory_only = False     # run section 4 alone
# output
out = ''                # also write the JSON object to this file
plot = ''               # draw measured vs predicted ratios into this .png (needs matplotlib)
profile = False         # print the top ops (torch.profiler) of one step of every variant

QUICK = dict(n_layer=4, n_head=2, n_kv_head=2, n_embd=64, vocab_size=256, D=4, B=2, S=2,
             batch_size=2, seq_len=32, train_warmup=1, train_reps=2, decode_batches=(1, 2),
             gen_lens=(4, 8), prompt_len=8, decode_reps=2, prefill_len=16, prefill_reps=2)
# -----------------------------------------------------------------------------
config_keys = [k for k, v in globals().items()
               if not k.startswith('_') and k != 'QUICK' and isinstance(v, (bool, int, float, str, tuple))]
_given = configure(globals(), config_keys, doc=__doc__)  # strict: an unknown key or a wrong type is one line, exit 2
if quick:
    for _k, _v in QUICK.items():
        if _k not in _given:
            globals()[_k] = _v
config = {k: globals()[k] for k in config_keys}

# fail fast, before minutes of timing, on anything the run would trip on at the end
check_out_file('out', out)
check_out_file('plot', plot)
if prefill_ckpt and not os.path.isfile(prefill_ckpt):
    fail(f"prefill_ckpt={prefill_ckpt}: no such file")
if plot:
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        fail("--plot needs matplotlib, which is not installed (pip install matplotlib)")
device_type = 'cuda' if device.startswith('cuda') else 'cpu'
if dtype == 'auto':
    dtype = 'bfloat16' if device_type == 'cuda' else 'float32'
if dtype not in ('float32', 'bfloat16'):
    fail(f"dtype={dtype!r}: expected 'auto', 'float32' or 'bfloat16'")
if D < 1 or not 0 <= B <= D or not 1 <= S <= seq_len:
    fail(f"need D >= 1, 0 <= B <= D, 1 <= S <= seq_len; got D={D}, B={B}, S={S}, seq_len={seq_len}")
for _k in ('batch_size', 'seq_len', 'train_reps', 'decode_reps', 'prefill_reps', 'prefill_len',
           'prefill_batch', 'prompt_len', 'vocab_size', 'n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mem_vocab'):
    if globals()[_k] < 1:
        fail(f"{_k}={globals()[_k]} must be >= 1")
for _k in ('train_warmup', 'mem_len'):
    if globals()[_k] < 0:
        fail(f"{_k}={globals()[_k]} must be >= 0")
if prefill_tol < 0:  # the jacobi-tol rows iterate until no state moves by more than this
    fail(f"prefill_tol={prefill_tol} must be >= 0")
if mem_gpu_gib <= 0:
    fail(f"mem_gpu_gib={mem_gpu_gib} must be > 0")
if not decode_batches or not gen_lens or min(decode_batches + gen_lens) < 1:
    fail("decode_batches and gen_lens must be non-empty tuples of positive ints")
if prefill_iters == -1:
    prefill_iters = D
if prefill_iters < 1:
    fail(f"prefill_iters={prefill_iters} must be >= 1 (or -1 for D)")
if compile_mode not in ('default', 'reduce-overhead', 'max-autotune'):
    fail(f"compile_mode={compile_mode!r}: expected 'default', 'reduce-overhead' or 'max-autotune'")
if compile_backend not in ('inductor', 'eager', 'aot_eager'):
    fail(f"compile_backend={compile_backend!r}: expected 'inductor', 'eager' or 'aot_eager'")

# torch is imported only now, so that a mistyped argument fails in milliseconds
# instead of after the seconds torch takes to import
import torch

from checkpoint import to_hf_llama
from diagnostics import activation_bytes
from flops import flops_per_token, rec_flops
from engine import Engine, StaticKVCache
from model import GPT, GPTConfig, KVCache

if device_type == 'cuda' and not torch.cuda.is_available():
    fail(f"device={device!r} but torch.cuda.is_available() is False")
# -----------------------------------------------------------------------------
# setup

if threads > 0:
    torch.set_num_threads(threads)
device_type, ptdtype, ctx = device_setup(device, dtype, seed)
if prefill_ckpt:  # read now: a bad (or crafted: refused unrun) file fails before minutes of timing
    from checkpoint import CheckpointError, load_checkpoint
    try:
        prefill_model = load_checkpoint(prefill_ckpt, device)[0].eval()
    except CheckpointError as e:
        fail(str(e))


def sync():
    # CUDA kernels run asynchronously: a timer must wait for them, at both ends
    if device_type == 'cuda':
        torch.cuda.synchronize()


L = n_layer
placement = {
    'none': (0, -1),
    't2mlr': ((12 * L) // 30 if t2mlr_start == -1 else t2mlr_start,
              math.ceil(18 * L / 30) - 1 if t2mlr_end == -1 else t2mlr_end),
    'lrt': (lrt_start, math.ceil(0.6 * L) - 1 if lrt_end == -1 else lrt_end),
}
block_size = max(seq_len, prefill_len, prompt_len + max(gen_lens))


def make_model(rec):
    torch.manual_seed(seed)  # identical backbone weights in every variant
    s, e = placement[rec]
    try:
        cfg = GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                        n_kv_head=n_kv_head, n_embd=n_embd, recurrence=rec, rec_start=s, rec_end=e)
    except ValueError as err:
        fail(str(err))
    return GPT(cfg).to(device)


def med(xs):
    return statistics.median(xs)


def mb(nbytes):
    return None if nbytes is None else round(nbytes / 2**20, 2)


def count_ops(fn):
    """Number of ATen ops fn() dispatches (after autograd and composite decomposition):
    on a small model every op costs ~Python + dispatch overhead, whatever its size."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        n = 0
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.n += 1
            return func(*args, **(kwargs or {}))
    with Counter():
        fn()
    return Counter.n


results = dict(config=config, env=dict(
    device=device, dtype=dtype, torch=torch.__version__, python=platform.python_version(),
    threads=torch.get_num_threads(), cpu=platform.processor() or platform.machine(),
    gpu=torch.cuda.get_device_name(device) if device_type == 'cuda' else None,
    load_avg=list(os.getloadavg()) if hasattr(os, 'getloadavg') else None))
if compile:
    # one compilation per (model, batch, cache length): more than dynamo's default limit of 8
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.cache_size_limit = 64
print(f"bench: device={device} dtype={dtype} compile={compile} threads={torch.get_num_threads()} "
      f"torch={torch.__version__}")
print(f"model: n_layer={n_layer} n_embd={n_embd} n_head={n_head} n_kv_head={n_kv_head} vocab={vocab_size}; "
      f"T2MLR blocks {placement['t2mlr'][0]}..{placement['t2mlr'][1]}, "
      f"LRT reads from block {placement['lrt'][0]}, source block {placement['lrt'][1]}")

# -----------------------------------------------------------------------------
# 4. memory at a training config's size: bytes saved for backward, and the predicted peak

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
    args.update(vocab_size=mem_vocab, vocab_pad=ns.get('vocab_pad', 128), reset_token=None)
    torch.manual_seed(seed)
    m = GPT(GPTConfig(**args)).to(device).train()
    T, mb_size = m.config.block_size, ns.get('batch_size', 32)
    n = mem_len or T  # tokens per measured sequence
    saved = []
    for b in (1, 2):
        x = torch.randint(0, mem_vocab, (b, n), device=device)
        with torch.autocast(device_type, dtype=torch.bfloat16):
            saved.append(activation_bytes(lambda: m(x, x, **scheme), (*m.parameters(), *m.buffers())))
    per_seq, per_step = (saved[1] - saved[0]) * T / n, 2 * saved[0] - saved[1]  # bytes per token: the same at any T
    n_params = sum(p.numel() for p in m.parameters())
    peak = 16 * n_params + per_step + per_seq * mb_size + 2 * 4 * mb_size * T * m.config.padded_vocab
    return dict(config=path, mode=scheme['mode'], recompute=scheme['recompute'], block_size=T, measured_len=n, micro_batch=mb_size,
                n_params=n_params, saved_gib_per_seq=per_seq / 2**30, saved_bytes_per_token=per_seq / T,
                predicted_peak_gib=peak / 2**30, fits=peak / 2**30 < 0.9 * mem_gpu_gib)



def memory_section():
    print(f"\n4. memory at the configs' size (bf16 autocast on {device}; predicted peak held against {mem_gpu_gib:g} GiB)")
    results['memory'] = []
    for path in mem_configs.split(','):
        if not os.path.isfile(path):
            fail(f"mem_configs: no config file {path}")
        r = config_memory(path)
        results['memory'].append(r)
        print(f"  {path}: {r['mode']}{' +recompute' if r['recompute'] else ''}, saved {r['saved_gib_per_seq']:.2f} GiB per "
              f"{r['block_size']}-token sequence ({r['saved_bytes_per_token'] / 1024:.0f} KB/token); micro-batch "
              f"{r['micro_batch']}: predicted peak {r['predicted_peak_gib']:.1f} GiB"
              + ('' if r['fits'] else f"  > 90% of {mem_gpu_gib:g} GiB: lower batch_size"), flush=True)


if memory_only:  # section 4 alone
    memory_section()
    print(json.dumps(results, default=float))
    sys.exit(0)

# -----------------------------------------------------------------------------
# 1. training step: forward(mode) + backward + AdamW, same batch for every variant

TRAIN = [  # (name, recurrence, mode, activation checkpointing)
    ('plain', 'none', 'plain', False),
    ('t2mlr+jacobi', 't2mlr', 'jacobi', False),
    ('lrt+interleaved', 'lrt', 'interleaved', False),
    ('t2mlr+interleaved', 't2mlr', 'interleaved', False),
    ('lrt+jacobi', 'lrt', 'jacobi', False),
    ('t2mlr+jacobi+rc', 't2mlr', 'jacobi', True),
    ('lrt+interleaved+rc', 'lrt', 'interleaved', True),
]
g = torch.Generator().manual_seed(seed)
data = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=g).to(device)
X, Y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
kw = dict(n_iter=D, n_grad=B, n_subsets=S)
variants = []
for name, rec, mode, rc in TRAIN:
    m = make_model(rec).train()
    groups = m.param_groups(weight_decay)
    for grp in groups:
        grp['lr'] = learning_rate * grp['lr_mult']
    opt = torch.optim.AdamW(groups, lr=learning_rate, betas=(0.9, 0.95),
                            **(dict(fused=True) if device_type == 'cuda' else {}))
    fwd = torch.compile(m) if compile_train else m
    variants.append(dict(name=name, rec=rec, mode=mode, recompute=rc, model=m, opt=opt, fwd=fwd, times=[], mem=[]))


def train_step(v):
    with ctx:
        _, loss = v['fwd'](X, Y, mode=v['mode'], recompute=v['recompute'], **kw)
    loss.backward()
    v['opt'].step()
    v['opt'].zero_grad(set_to_none=True)
    return loss


# Round-robin (plain, t2mlr, lrt, ..., plain, t2mlr, ...) rather than all reps of one
# variant then the next: on a shared machine the load drifts, and interleaving spreads
# the drift over every variant instead of biasing whichever ran during a busy spell.
print(f"\n1. training step: batch {batch_size} x {seq_len} tokens, D={D} B={B} S={S}, "
      f"{train_warmup} warm-up + {train_reps} timed steps each")
for rep in range(train_warmup + train_reps):
    for v in variants:
        if device_type == 'cuda':
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        sync()
        t0 = time.perf_counter()
        loss = train_step(v)
        sync()
        dt = time.perf_counter() - t0
        if rep >= train_warmup:
            v['times'].append(dt)
            if device_type == 'cuda':  # the step's own memory: activations, grads, temporaries
                v['mem'].append(torch.cuda.max_memory_allocated(device) - base)
        v['loss'] = loss.item()
plain_flops = flops_per_token(variants[0]['model'].config, seq_len, 'plain')
rows = []
for v in variants:
    m = v['model']
    with ctx:
        # parameters and buffers (the RoPE tables) are not activations: left out of the count
        act = activation_bytes(lambda: m(X, Y, mode=v['mode'], recompute=v['recompute'], **kw), (*m.parameters(), *m.buffers()))
    fl = flops_per_token(m.config, seq_len, v['mode'], **kw)
    t = med(v['times'])
    rows.append(dict(name=v['name'], recurrence=v['rec'], mode=v['mode'], step_ms=1e3 * t,
                     step_ms_min=1e3 * min(v['times']), step_ms_max=1e3 * max(v['times']),
                     tokens_per_s=batch_size * seq_len / t, flops_per_token=fl,
                     achieved_gflops=fl * batch_size * seq_len / t / 1e9,
                     flop_ratio=fl / plain_flops, act_mem_mb=mb(act), act_bytes_per_token=act / (batch_size * seq_len),
                     step_peak_mem_mb=mb(max(v['mem'])) if v['mem'] else None,
                     loss=v['loss'], n_params=sum(p.numel() for p in m.parameters())))
for r in rows:
    r['ratio'] = r['step_ms'] / rows[0]['step_ms']
    r['ratio_over_flops'] = r['ratio'] / r['flop_ratio']  # > 1: slower than the arithmetic explains
    r['act_mem_ratio'] = r['act_mem_mb'] / rows[0]['act_mem_mb'] if rows[0]['act_mem_mb'] else None
results['train'] = rows
print(f"{'variant':<19} {'ms/step':>9} {'tok/s':>9} {'ratio':>6} {'FLOPs':>6} {'GFLOP/s':>8} "
      f"{'act MB':>7} {'KB/tok':>7} {'act x':>6} {'peak MB':>8}")
for r in rows:
    pk = '-' if r['step_peak_mem_mb'] is None else f"{r['step_peak_mem_mb']:.1f}"
    print(f"{r['name']:<19} {r['step_ms']:9.1f} {r['tokens_per_s']:9.0f} {r['ratio']:6.2f} {r['flop_ratio']:6.2f} "
          f"{r['achieved_gflops']:8.2f} {r['act_mem_mb']:7.1f} {r['act_bytes_per_token'] / 1024:7.1f} "
          f"{r['act_mem_ratio']:6.2f} {pk:>8}")
print("  ratio = measured step time / plain; FLOPs = flops.flops_per_token(mode) / plain's; act MB = tensors "
      "saved for backward (KB/tok: per trained token); +rc = activation checkpointing (recompute=True)"
      + ("; peak MB = cuda max_memory_allocated during the step" if device_type == 'cuda' else " (peak memory: cuda only)"))
del variants, train_step
if device_type == 'cuda':
    torch.cuda.empty_cache()

# -----------------------------------------------------------------------------
# 2. decode: time decode_step only (no sampling, no prefill), one pass per token

models = {rec: make_model(rec).eval() for rec in ('none', 't2mlr', 'lrt')}
NAMES = {'none': 'plain', 't2mlr': 't2mlr', 'lrt': 'lrt'}
results['models'] = {NAMES[r]: dict(recurrence=r, rec_start=placement[r][0] if r != 'none' else None,
                                    rec_end=placement[r][1] if r != 'none' else None,
                                    n_params=sum(p.numel() for p in m.parameters()), rec_flops_per_token=rec_flops(m.config))
                     for r, m in models.items()}


CMODE = dict(backend=compile_backend, **({} if compile_mode == 'default' else dict(mode=compile_mode)))


ENGINES = {r: Engine(m, CMODE) for r, m in models.items()} if compile else {}  # engine.py: the compiled steps


def run_compiled(fn):
    with compile_errors():
        return fn()


def decode_run(m, step, n_gen, toks, prompt, compiled):
    """Prefill the prompt (untimed), then time n_gen calls of step (model.decode_step, or the
    engine's compiled one over a static cache); seconds per token. toks: n_gen (B, 1) input
    tokens, one tensor each."""
    cache = (StaticKVCache if compiled else KVCache)(n_layer, prompt_len + n_gen)
    pos = POS if compiled else [range(t, t + 1) for t in range(block_size)]
    with ctx:
        _, state, _ = m.prefill(prompt, cache, 'exact')
        sync()
        t0 = time.perf_counter()
        for i in range(n_gen):
            # fixed random input tokens: the cost does not depend on the values, and no
            # sampling op muddies the per-token time
            _, state = step(toks[i], pos[prompt_len + i], state, cache)  # (a CUDA graph's output: cloned)
        sync()
    return (time.perf_counter() - t0) / n_gen


def decode_ops(m, bsz):
    """ATen ops of ONE decode_step (at position prompt_len)."""
    cache = KVCache(n_layer, prompt_len + 1)
    prompt = torch.randint(0, vocab_size, (bsz, prompt_len + 1), device=device)
    with ctx:
        _, state, _ = m.prefill(prompt[:, :-1], cache, 'exact')
        return count_ops(lambda: m.decode_step(prompt[:, -1:], range(prompt_len, prompt_len + 1), state, cache))


def hf_peer_model():
    """transformers' LlamaForCausalLM with the plain model's shape and weights (None
    without transformers): the reference implementation a user would otherwise run."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    return to_hf_llama(models['none'])


def hf_run(hf, n_gen, prompt):
    """HF generate (greedy, use_cache), n_gen new tokens; seconds per decoded token,
    timed between the first and the last call of a logits processor, which HF runs once
    per new token (so the prompt's prefill is left out, as in decode_run). Also the tokens."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class Clock(LogitsProcessor):
        def __init__(self):
            self.t = []
        def __call__(self, input_ids, scores):
            sync()
            self.t.append(time.perf_counter())
            return scores
    clock = Clock()
    with ctx:
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_gen, min_new_tokens=n_gen,
                          do_sample=False, use_cache=True, logits_processor=LogitsProcessorList([clock]),
                          pad_token_id=0)
    return (clock.t[-1] - clock.t[0]) / (n_gen - 1), out


POS = [torch.tensor([t], device=device) for t in range(block_size)]  # the position tensors the compiled step reads
print(f"\n2. decode: prompt {prompt_len}, decode_step only, median of {decode_reps} runs"
      + (f"; eager and compiled (mode {compile_mode}), all round-robin" if compile else ""))
hf = hf_peer_model() if hf_peer else None
rows, crows, hrows = [], [], []
for bsz in decode_batches:
    for n_gen in gen_lens:
        g = torch.Generator().manual_seed(seed)
        prompt = torch.randint(0, vocab_size, (bsz, prompt_len), generator=g).to(device)
        toks = torch.randint(0, vocab_size, (bsz, n_gen), generator=g).to(device)
        toks = [toks[:, i:i + 1].contiguous() for i in range(n_gen)]
        steps = {(r, 'eager'): m.decode_step for r, m in models.items()}
        if compile:
            steps.update({(r, 'compiled'): ENGINES[r].decode_step for r in models})
        runs = {k: (lambda k=k: decode_run(models[k[0]], steps[k], n_gen, toks, prompt, k[1] == 'compiled')) for k in steps}
        if hf is not None and n_gen > 1:
            runs[('hf', 'eager')] = lambda: hf_run(hf, n_gen, prompt)[0]
        times = {k: [] for k in runs}
        for k, run in runs.items():  # warm-up (and compilation): one full run each
            run_compiled(run)
        for rep in range(decode_reps):
            for k, run in runs.items():
                times[k].append(run())
        ctx_len = prompt_len + n_gen / 2  # mean context a decoded token attends over
        base_fl = flops_per_token(models['none'].config, ctx_len, 'plain', train=False)
        ops = {r: decode_ops(m, bsz) for r, m in models.items()}
        for r, m in models.items():
            t = med(times[(r, 'eager')])
            rows.append(dict(model=NAMES[r], batch=bsz, gen_len=n_gen, ms_per_token=1e3 * t,
                             tokens_per_s=bsz / t,
                             flop_ratio=flops_per_token(m.config, ctx_len, 'exact', train=False) / base_fl,
                             ops_per_token=ops[r], ops_ratio=ops[r] / ops['none'],
                             us_per_op=1e6 * t / ops[r]))
            if compile:
                tc = med(times[(r, 'compiled')])
                crows.append(dict(model=NAMES[r], batch=bsz, gen_len=n_gen, mode=compile_mode, ms_per_token=1e3 * tc,
                                  tokens_per_s=bsz / tc, flop_ratio=rows[-1]['flop_ratio'],
                                  speedup_over_eager=t / tc))
        base = rows[-len(models)]['ms_per_token']
        for row in rows[-len(models):]:
            row['ratio'] = row['ms_per_token'] / base
            row['ratio_over_flops'] = row['ratio'] / row['flop_ratio']
        if compile:
            cbase = crows[-len(models)]['ms_per_token']
            for row in crows[-len(models):]:
                row['ratio'] = row['ms_per_token'] / cbase  # against COMPILED plain
                row['ratio_over_flops'] = row['ratio'] / row['flop_ratio']
        if ('hf', 'eager') in times:
            th = med(times[('hf', 'eager')])
            _, hf_out = hf_run(hf, n_gen, prompt)
            with ctx:
                ours = models['none'].generate(prompt, n_gen, temperature=0)
            hrows.append(dict(model='hf_llama_generate', batch=bsz, gen_len=n_gen, ms_per_token=1e3 * th,
                              tokens_per_s=bsz / th, ratio_to_plain_eager=th * 1e3 / base,
                              ratio_to_plain_compiled=th * 1e3 / cbase if compile else None,
                              same_greedy_tokens=bool(torch.equal(hf_out, ours))))
results['decode'] = rows
results['decode_compiled'] = crows
results['decode_hf'] = hrows
print(f"{'model':<7} {'batch':>5} {'gen':>5} {'ms/tok':>8} {'tok/s':>9} {'ratio':>6} {'FLOPs':>6} "
      f"{'ops/tok':>8} {'ops x':>6} {'us/op':>6}" + (f" {'compiled':>9} {'ratio':>6} {'speedup':>7}" if compile else ''))
for i, r in enumerate(rows):
    line = (f"{r['model']:<7} {r['batch']:5d} {r['gen_len']:5d} {r['ms_per_token']:8.3f} {r['tokens_per_s']:9.1f} "
            f"{r['ratio']:6.3f} {r['flop_ratio']:6.3f} {r['ops_per_token']:8d} {r['ops_ratio']:6.3f} {r['us_per_op']:6.1f}")
    if compile:
        c = crows[i]
        line += f" {c['ms_per_token']:9.3f} {c['ratio']:6.3f} {c['speedup_over_eager']:6.2f}x"
    print(line)
for h in hrows:
    print(f"{'HF gen':<7} {h['batch']:5d} {h['gen_len']:5d} {h['ms_per_token']:8.3f} {h['tokens_per_s']:9.1f} "
          f"{h['ratio_to_plain_eager']:6.3f}   (x plain eager" + (f"; {h['ratio_to_plain_compiled']:.2f}x plain compiled"
          if compile else '') + f"; same greedy tokens: {h['same_greedy_tokens']})")
print("  FLOPs = flops_per_token(exact, forward) / plain's at the mean context; ops = ATen ops per "
      "decode_step (when ops dominate, the ratio follows ops x, not FLOPs)"
      + ("; compiled: ms/token of the torch.compile'd decode_step and its ratio to COMPILED plain" if compile else '')
      + ("; HF gen: LlamaForCausalLM.generate, greedy, use_cache, same weights as plain, per decoded token" if hrows else ''))

# -----------------------------------------------------------------------------
# 3. prefill: a prompt of prefill_len tokens into an empty cache; the Jacobi prefill to tolerance

print(f"\n3. prefill: batch {prefill_batch} x {prefill_len} tokens, Jacobi k={prefill_iters} and to tolerance "
      f"{prefill_tol:g}, median of {prefill_reps} runs")
prompts = {r: torch.randint(0, vocab_size, (prefill_batch, prefill_len), generator=torch.Generator().manual_seed(seed))
           .to(device) for r in models}
if prefill_ckpt:  # a trained model: random ids of its vocabulary are inputs of the s5 tasks (parity, S3)
    models['ckpt'] = prefill_model
    NAMES['ckpt'] = 'ckpt'
    c = models['ckpt'].config
    prompts['ckpt'] = torch.randint(0, c.vocab_size, (prefill_batch, min(prefill_len, c.block_size)),
                                    generator=torch.Generator().manual_seed(seed)).to(device)
CASES = [('none', 'plain')] + [(r, mode) for r in ('t2mlr', 'lrt') for mode in ('plain', 'exact', 'jacobi', 'jacobi-tol')]
CASES += [('ckpt', mode) for mode in ('plain', 'exact', 'jacobi', 'jacobi-tol') if prefill_ckpt]
if compile:  # the exact prefill's span steps compiled; and the plain prefill compiled whole, its peer
    CASES += [('none', 'plain-compiled'), ('t2mlr', 'exact-compiled'), ('lrt', 'exact-compiled')]
    plain_prefill_compiled = torch.compile(models['none'].prefill, dynamic=False, **CMODE)
times, passes = {c: [] for c in CASES}, {}


def prefill_run(r, mode):
    m, prompt = models[r], prompts[r]
    cache = (StaticKVCache if mode == 'exact-compiled' else KVCache)(m.config.n_layer, prompt.size(1))
    with ctx:
        sync()
        t0 = time.perf_counter()
        if mode == 'plain-compiled':
            plain_prefill_compiled(prompt, cache, 'plain')
        elif mode == 'exact-compiled':
            ENGINES[r].prefill(prompt, cache, 'exact')
        else:
            passes[(r, mode)] = m.prefill(prompt, cache, mode.removesuffix('-tol'), n_iter=prefill_iters,
                                          tol=prefill_tol if mode == 'jacobi-tol' else None)[2]
        sync()
    return time.perf_counter() - t0


for rep in range(1 + prefill_reps):  # first round = warm-up (and compilation)
    for c in CASES:
        dt = run_compiled(lambda: prefill_run(*c)) if rep == 0 else prefill_run(*c)
        if rep:
            times[c].append(dt)
rows = []
for r, mode in CASES:
    m, t, T = models[r], med(times[(r, mode)]), prompts[r].size(1)
    base = ('ckpt', 'plain') if r == 'ckpt' else ('none', 'plain')  # the same backbone, no recurrence
    n = passes.get((r, mode), 0) - 1 if mode == 'jacobi-tol' else prefill_iters  # its D
    fl = flops_per_token(m.config, T, mode.removesuffix('-compiled').removesuffix('-tol'), n_iter=max(n, 1),
                         n_grad=0, train=False)
    fl_base = flops_per_token(m.config, T, 'plain', train=False)
    rows.append(dict(model=NAMES[r], mode=mode, n_iter=n if mode.startswith('jacobi') else None,
                     span_passes=passes.get((r, mode)), prompt_len=T, batch=prefill_batch, ms=1e3 * t,
                     tokens_per_s=prefill_batch * T / t, flop_ratio=fl / fl_base, base=base))
for row in rows:
    row['ratio'] = row['ms'] / next(x['ms'] for x in rows if (x['model'], x['mode']) == (NAMES[row['base'][0]], row['base'][1]))
    row['ratio_over_flops'] = row['ratio'] / row['flop_ratio']
    if compile and row['mode'].endswith('-compiled'):  # against the compiled plain prefill
        row['ratio_to_plain_compiled'] = row['ms'] / next(r['ms'] for r in rows if r['mode'] == 'plain-compiled')
    del row['base']
results['prefill'] = rows
print(f"{'model':<7} {'mode':<14} {'T':>5} {'ms':>9} {'tok/s':>9} {'ratio':>7} {'FLOPs':>6} {'passes':>7}"
      + (f" {'x compiled plain':>16}" if compile else ''))
for r in rows:
    cx = f" {r['ratio_to_plain_compiled']:16.2f}" if 'ratio_to_plain_compiled' in r else ''
    ps = '-' if r['span_passes'] is None else str(r['span_passes'])
    print(f"{r['model']:<7} {r['mode']:<14} {r['prompt_len']:5d} {r['ms']:9.2f} {r['tokens_per_s']:9.0f} {r['ratio']:7.2f} "
          f"{r['flop_ratio']:6.2f} {ps:>7}{cx}")
print("  ratio = x the plain prefill of the same backbone; exact runs the span token by token (its cost is latency, "
      "not FLOPs); jacobi-tol iterates until no state moves by more than prefill_tol (passes: span passes it took)")

if mem_configs:
    memory_section()

# -----------------------------------------------------------------------------
# optional: where the time goes (torch.profiler, one step of each variant)

if profile:
    from torch.profiler import profile as tprofile, ProfilerActivity
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == 'cuda' else [])
    sort = 'self_device_time_total' if device_type == 'cuda' else 'self_cpu_time_total'
    for name, rec, mode, rc in TRAIN:
        m = make_model(rec).train()
        with ctx:
            m(X, Y, mode=mode, **kw)[1].backward()  # warm-up
        with tprofile(activities=acts) as prof:
            with ctx:
                m(X, Y, mode=mode, **kw)[1].backward()
            sync()
        print(f"\nprofile: training forward+backward, {name}")
        print(prof.key_averages().table(sort_by=sort, row_limit=12))
    for r, m in models.items():
        cache = KVCache(n_layer, prompt_len + 1)
        p = torch.randint(0, vocab_size, (1, prompt_len + 1), device=device)
        with ctx:
            _, st, _ = m.prefill(p[:, :-1], cache, 'exact')
            with tprofile(activities=acts) as prof:
                m.decode_step(p[:, -1:], range(prompt_len, prompt_len + 1), st, cache)
                sync()
        print(f"\nprofile: one decode_step, batch 1, {NAMES[r]}")
        print(prof.key_averages().table(sort_by=sort, row_limit=12))

# -----------------------------------------------------------------------------
# output

results['notes'] = dict(
    ratio="measured time / plain model's time; lower is better",
    flop_ratio="flops.flops_per_token(...) / plain's: what the ratio would be if time were proportional to FLOPs",
    act_mem_mb="bytes autograd saves for backward in one training forward (per storage, parameters and "
               "buffers excluded; under autocast the low-precision weight copies count too)",
    step_peak_mem_mb="cuda: max_memory_allocated during the step minus what was allocated before it; null on cpu",
    ops_per_token="ATen ops dispatched by one decode_step (TorchDispatchMode count)",
    decode_ctx="decode flop_ratio at the mean context prompt_len + gen_len / 2",
    load_avg="os.getloadavg() at start: on a shared machine, timings are noisy")
if plot:
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    # the plain rows are the baseline (1.0 by definition): the black line, not a bar
    tr = [r for r in results['train'] if r['name'] != 'plain']
    de = [r for r in results['decode'] if r['model'] != 'plain']
    pr = results['prefill'][1:]
    panels = [
        ('training step', [r['name'] for r in tr], tr),
        ('decode, per token', [f"{r['model']} batch {r['batch']} gen {r['gen_len']}" for r in de], de),
        (f"prefill of {prefill_len} tokens", [f"{r['model']} {r['mode']}" for r in pr], pr),
    ]
    for ax, (title, labels, rs) in zip(axes, panels):
        xs = range(len(rs))
        ax.bar([x - 0.2 for x in xs], [r['ratio'] for r in rs], 0.4, label='measured')
        ax.bar([x + 0.2 for x in xs], [r['flop_ratio'] for r in rs], 0.4, label='FLOP-predicted')
        ax.axhline(1.0, color='k', lw=0.8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, rotation=60, ha='right', fontsize=7)
        ax.set_title(title)
        ax.set_ylabel('time / plain model')
    axes[0].legend()
    fig.suptitle(f"recurrence cost vs plain GPT ({device}, {dtype}, L={n_layer}, d={n_embd})")
    fig.tight_layout()
    fig.savefig(plot, dpi=120)
    print(f"\nwrote {plot}")
line = json.dumps(results, default=float)
if out:
    with open(out, 'w') as f:
        f.write(line + '\n')
    print(f"wrote {out}")
print(line)
