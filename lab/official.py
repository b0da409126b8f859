"""
Our model next to the official code, in one process on one thread (docs/peers.md):

  T2MLR  princeton-pli/T2MLR's T2MLRWrapper over a transformers Llama, built at our shape with our
         weights copied in (the S5-Retrieval settings: gated mixer, projection, residual to the
         cache, detached, RMS post-norm). Agreement: the Jacobi training loss and every gradient,
         the exact-evaluation loss, the decode logits and the greedy tokens of generate. Then time.
  LRT    OoDBag/Latent_recurrent_transformer's nanochat GPT at our shape. Its backbone differs
         (QK norm, relu^2, softcap, weightless norms), so only the time compares.

    python lab/official.py --t2mlr_repo=PATH --lrt_repo=PATH
    T2MLR_REPO=PATH LRT_REPO=PATH python lab/official.py --seq_len=32 --reps=3

Both repos are local checkouts; nothing is downloaded. Workarounds applied here, in-process: the
T2MLR release imports components.t2mlr_utils, which it does not ship (the code is in
components/rcot_utils.py: aliased); it imports IPython for nothing (stubbed if not installed);
LRT's engine imports its tokenizer (rustbpe) through the checkpoint manager, which KVCache does
not need (stubbed). From transformers 5.24 on, generate() hands the KV cache over as `cache=`,
which the official T2MLR generate() does not read, so it would decode without the recurrence: the
tool hands it on as `past_key_values` (workaround 5), and counts the mixer's calls during generate;
if it still did not run, the report says NOT COMPARED, and why, instead of comparing tokens.
Our side (the weight mapping, the decode loops, the report) is tested without the checkouts
(tests/test_official.py), our own model in the official code's place.
Times: medians of `reps` runs after a warm-up, ours and theirs alternately; ratio = ours/theirs.
Prints a table, then ONE JSON object with every figure on the last line.
"""

import importlib.util
import inspect
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import types
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the repo root: its modules are top level
from configurator import configure, fail  # noqa: E402

# -----------------------------------------------------------------------------
# config
t2mlr_repo = os.environ.get('T2MLR_REPO', '')  # a checkout of princeton-pli/T2MLR
lrt_repo = os.environ.get('LRT_REPO', '')      # a checkout of OoDBag/Latent_recurrent_transformer
n_layer = 6             # the shape: 5,279,490 parameters with T2MLR at these values
n_head = 4
n_embd = 256
vocab_size = 512
t2mlr_start = 2         # T2MLR's span (l_start, l_end); LRT reads at every layer from the last
t2mlr_end = 3
n_iter = 8              # Jacobi iterations, the papers' D (batch_forward_approximate_depth)
n_grad = 4              # ... with gradient, B (batch_backward_approximate_depth)
n_subsets = 2           # LRT's interleaved passes, the papers' S
lrt_gate_channels = 32  # LRT's ve_gate_channels at e0d0f6e
batch_size = 4
seq_len = 128
prompt_len = 16
gen_len = 64            # greedy tokens compared, and decoded per timing run
reps = 5
threads = 1
seed = 1337
out = ''                # also write the JSON object to this file
config_keys = [k for k, v in globals().items() if not k.startswith('_') and isinstance(v, (int, float, str))
               and k not in ('ROOT',)]


def check_config():
    """The settings, before anything is imported: one line naming the first broken one."""
    for key, path, mark, repo in (('t2mlr_repo', t2mlr_repo, 'src/t2mlr_wrapper', 'princeton-pli/T2MLR'),
                                  ('lrt_repo', lrt_repo, 'nanochat/gpt.py', 'OoDBag/Latent_recurrent_transformer')):
        if not path:
            fail(f"{key} is not set: --{key}=PATH or {key.upper()}=PATH, a local checkout of {repo}")
        if not os.path.exists(os.path.join(path, mark)):
            fail(f"{key}={path}: no {mark} there (not a checkout of {repo})")
    if gen_len < 2 or min(seq_len, prompt_len, batch_size, reps) < 1 or not 0 <= n_grad <= n_iter:
        fail("need gen_len >= 2, seq_len, prompt_len, batch_size, reps >= 1 and 0 <= n_grad <= n_iter")
    try:  # the shape both models are built at (--n_head=3 was a ValueError traceback from GPTConfig)
        GPTConfig(block_size=max(seq_len, prompt_len + gen_len), vocab_size=vocab_size, n_layer=n_layer,
                  n_head=n_head, n_kv_head=n_head, n_embd=n_embd, recurrence='t2mlr', rec_start=t2mlr_start,
                  rec_end=t2mlr_end)
    except ValueError as e:
        fail(str(e))


import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lab.model_full import GPT, GPTConfig, KVCache  # noqa: E402
from support.checkpoint import HF_LLAMA_NAMES, to_hf_llama  # noqa: E402
from support.diagnostics import activation_bytes  # noqa: E402

# -----------------------------------------------------------------------------
# the official code, with the workarounds


def official_import(what, repo, fn, workarounds):
    try:
        return fn()
    except Exception as e:
        fail(f"cannot import the official {what} from {repo}: {type(e).__name__}: {e} (workarounds applied: "
             f"{workarounds}; docs/peers.md)")


def import_t2mlr():
    sys.path.append(os.path.join(os.path.abspath(t2mlr_repo), 'src'))
    if importlib.util.find_spec('IPython') is None:  # t2mlr_wrapper.py: `from IPython import embed`, never called
        sys.modules['IPython'] = types.ModuleType('IPython')
        sys.modules['IPython'].embed = lambda *a, **k: None
    if importlib.util.find_spec('components.t2mlr_utils') is None:  # imported, not shipped: the code is rcot_utils
        import components.rcot_utils
        sys.modules['components.t2mlr_utils'] = components.rcot_utils
    from t2mlr_wrapper import T2MLRConfig, T2MLRWrapper
    return T2MLRConfig, T2MLRWrapper


def import_lrt():
    sys.path.append(os.path.abspath(lrt_repo))
    stub = types.ModuleType('nanochat.checkpoint_manager')  # engine.py imports load_model from it (and so the
    stub.load_model = None                                   # tokenizer, rustbpe); KVCache needs neither
    sys.modules.setdefault('nanochat.checkpoint_manager', stub)
    import nanochat.gpt
    from nanochat.engine import KVCache as LRTCache
    return nanochat.gpt, LRTCache


def commit(path):
    try:
        return subprocess.run(['git', '-C', path, 'rev-parse', 'HEAD'], capture_output=True, text=True,
                              timeout=10).stdout.strip() or 'unknown'
    except OSError:
        return 'unknown'

# -----------------------------------------------------------------------------
# measuring


def compare(ours_fn, theirs_fn):
    """Median seconds of ours and theirs, run alternately after one warm-up each. fn() returns the
    seconds it measured itself (a float), or anything else: its whole call is timed."""
    times = ([], [])
    for rep in range(1 + reps):
        for ts, fn in zip(times, (ours_fn, theirs_fn)):
            t0 = time.perf_counter()
            dt = fn()
            if rep:
                ts.append(dt if isinstance(dt, float) else time.perf_counter() - t0)
    o, t = statistics.median(times[0]), statistics.median(times[1])
    return dict(ours_ms=1e3 * o, theirs_ms=1e3 * t, ratio=o / t)


def train_step(loss_fn, opt):
    loss_fn().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def weights(m):
    return (*m.parameters(), *m.buffers())


def timings(ours, theirs, ours_loss, theirs_loss, ours_exact, theirs_exact, ours_decode, theirs_decode):
    """The four ratios ours/theirs: training step (forward, backward, the same torch AdamW), decode per
    token, exact evaluation of the batch, and the bytes saved for backward by one training forward."""
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (ours, theirs)]
    ours.train(), theirs.train()
    r = dict(train_step=compare(lambda: train_step(ours_loss, opts[0]), lambda: train_step(theirs_loss, opts[1])))
    mem = [activation_bytes(fn, weights(m)) for fn, m in ((ours_loss, ours), (theirs_loss, theirs))]
    ours.eval(), theirs.eval()
    with torch.no_grad():
        r['decode_per_token'] = compare(ours_decode, theirs_decode)
        r['exact_eval'] = compare(ours_exact, theirs_exact)
    r['train_memory'] = dict(ours_mib=mem[0] / 2**20, theirs_mib=mem[1] / 2**20, ratio=mem[0] / mem[1])
    return r


def n_params(m):
    return sum(p.numel() for p in m.parameters())

# -----------------------------------------------------------------------------
# our side of the comparison: the weight mapping, the decode loops, the report. Each takes its
# peer as an argument, so tests/test_official.py runs them with our own model as the peer when
# the checkouts are absent: a change to model.py's decode_step cannot break this tool unseen.

# our fusion's parameters -> the official gated mixer's (DESIGN.md 11)
MIXER_NAMES = {'w_rec.weight': 'recurrent_projection.weight', 'f_cur.weight': 'input_gate_proj.weight',
               'f_cur.bias': 'input_gate_proj.bias', 'f_rec.weight': 'recurrent_gate_proj.weight',
               'f_rec.bias': 'recurrent_gate_proj.bias', 'g_cur': 'rezero_gamma_input_gate',
               'g_rec': 'rezero_gamma_recurrent_gate'}


def map_t2mlr(ours, hf, mixer):
    """Our T2MLR GPT against the peer's Llama backbone, hf: {name: parameter} named as
    checkpoint.HF_LLAMA_NAMES (to_hf_llama's, taken before the official wrapper renames its
    layers), holding our weights; and its mixing module. Copies our fusion's weights into the mixer.
    -> {our parameter: [the peer's tensors]} (a list: our fused matrix is theirs stacked by rows).
    Every parameter of each side must be mapped, or an AssertionError names the first that is not."""
    mix, mine = dict(mixer.named_parameters()), dict(ours.named_parameters())
    pairs = {}
    for k_ours, k_hf in HF_LLAMA_NAMES.items():
        for i in (range(ours.config.n_layer) if '{i}' in k_ours else [None]):
            keys = [k.format(i=i) for k in ((k_hf,) if isinstance(k_hf, str) else k_hf)]
            if keys[0] in hf:  # lm_head: tied
                pairs[k_ours.format(i=i)] = [hf[k] for k in keys]
    for k_ours, k_mix in MIXER_NAMES.items():
        pairs['fusion.' + k_ours] = [mix[k_mix]]
        with torch.no_grad():
            mix[k_mix].copy_(mine['fusion.' + k_ours].view_as(mix[k_mix]))
    mapped = {id(p) for ps in pairs.values() for p in ps}
    left = [k for k, p in (*hf.items(), *mix.items()) if id(p) not in mapped]
    assert not left, f"official parameters with no counterpart of ours: {left[:3]}"
    assert set(pairs) == set(mine), f"parameters of ours with no official counterpart: {sorted(set(mine) - set(pairs))[:3]}"
    return pairs


def ours_decode(m, prompt, toks):
    """Our model's decode loop: prefill the prompt (untimed; T2MLR plain, as its official generate
    treats a prompt), then one decode_step per token of toks. -> (seconds per token, last logits)."""
    T0 = prompt.size(1)
    cache = KVCache(m.config.n_layer, T0 + len(toks))
    _, state, _ = m.prefill(prompt, cache, 'plain' if m.rec == 't2mlr' else 'exact')
    t0 = time.perf_counter()
    for i, tok in enumerate(toks):
        logits, state = m.decode_step(tok, range(T0 + i, T0 + i + 1), state, cache)
    return (time.perf_counter() - t0) / len(toks), logits


def theirs_decode(m, prompt, toks):
    """The official per-token path of generate(): the prompt plain (control flow 1, seeding the state
    from its last token), then one simple_recurrent_forward per token (control flow 2).
    -> (seconds per token, last logits)."""
    m._force_simple_recurrent, m.auto_control_flow_generation, m.recurrent_cache = True, True, None
    try:
        pkv = m(input_ids=prompt, control_flows=torch.ones_like(prompt), use_cache=True).past_key_values
        t0 = time.perf_counter()
        for tok in toks:
            o = m(input_ids=tok, control_flows=torch.full_like(tok, 2), past_key_values=pkv, use_cache=True)
            pkv = o.past_key_values
        return (time.perf_counter() - t0) / len(toks), o.logits
    finally:
        m._force_simple_recurrent, m.auto_control_flow_generation = False, False


def greedy_tokens(theirs, mixer, prompt, n, renamed):
    """The official generate()'s greedy tokens, and how many times its mixer ran. renamed: the
    transformers that hands generate's cache over as `cache=` (5.24.0 on), which the official
    prepare_inputs_for_generation does not read: it is handed on as `past_key_values` here (as
    the use_cache=False workaround does for Jacobi training), or it would decode with no recurrence."""
    calls = []
    hook = mixer.register_forward_hook(lambda *a: calls.append(1))
    prepare = theirs.prepare_inputs_for_generation
    if renamed:  # named arguments: generate() validates its kwargs against this signature

        def handed_on(input_ids, attention_mask=None, cache=None, **kw):
            return prepare(input_ids, past_key_values=cache, attention_mask=attention_mask, **kw)
        theirs.prepare_inputs_for_generation = handed_on
    try:
        toks = theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, use_cache=True, pad_token_id=0)
    finally:
        hook.remove()
        if renamed:
            del theirs.prepare_inputs_for_generation
    return toks, len(calls)


def report(results):
    """The table of results (the JSON object main() prints last) on stdout."""
    c, env, a = results['config'], results['env'], results['t2mlr']['agreement']
    print(f"\nT2MLR, {a['n_params']:,} parameters each; Jacobi n_iter={c['n_iter']} n_grad={c['n_grad']}, batch {c['batch_size']} x {c['seq_len']}")
    print(f"  Jacobi loss      ours {a['jacobi_loss_ours']:.7f}  theirs {a['jacobi_loss_theirs']:.7f}  diff {a['jacobi_loss_diff']:.1e}")
    print(f"  gradients        max relative difference {a['max_rel_grad_diff']:.1e} over {a['n_grads']} parameters "
          f"(worst: {a['worst_param']})")
    print(f"  with use_cache unset (the official trainer's call): loss diff {a['default_cache_loss_diff']:.1e}, gradients "
          f"{a['default_cache_max_rel_grad_diff']:.1e}" + ("" if a['default_cache_max_rel_grad_diff'] <= 1e-4 else "  DIFFERENT"
          + (": its Jacobi iterations attend to stale keys (the KV cache leaks into them as `cache=`, transformers >= 5.24)"
             if env['generate_cache_renamed'] else "")))
    print(f"  exact-eval loss  ours {a['exact_loss_ours']:.7f}  theirs {a['exact_loss_theirs']:.7f}  diff {a['exact_loss_diff']:.1e}"
          f"  (the recurrence moves it by {a['recurrence_effect']:.1e})")
    print(f"  decode logits    max difference {a['decode_logits_diff']:.1e} after {c['gen_len']} steps")
    if a['tokens_equal'] is None:
        print(f"  greedy tokens    NOT COMPARED: the official generate() ran without the recurrence (its mixer ran 0 "
              f"times under transformers {env['transformers']}{', with the cache handed on as past_key_values' if env['generate_cache_renamed'] else ''}), "
              "so its tokens are a plain model's; run under transformers <= 5.23 (docs/peers.md)")
    else:
        print(f"  greedy tokens    {c['gen_len']}: {'equal' if a['tokens_equal'] else 'DIFFERENT'} "
              f"(official mixer ran {a['generate_mixer_calls']} times"
              + (", the cache handed on as past_key_values: workaround 5" if env['generate_cache_renamed'] else "") + ")")
    if 'lrt' in results:
        print(f"  LRT: {results['lrt']['n_params_ours']:,} parameters ours, {results['lrt']['n_params_theirs']:,} theirs "
              f"(another backbone: time only); interleaved n_subsets={c['n_subsets']}")
    models = [m for m in ('t2mlr', 'lrt') if m in results]
    print(f"\n{'ours / theirs':<18}" + "".join(f" {m.upper():>26}" for m in models))
    for key, name in (('train_step', 'training step'), ('decode_per_token', 'decode per token'),
                      ('exact_eval', 'exact evaluation'), ('train_memory', 'training memory')):
        cells = []
        for m in models:
            r = results[m]['timing'][key]
            unit = ('mib', 'MiB') if key == 'train_memory' else ('ms', 'ms')
            cells.append(f"{r['ratio']:.2f} ({r['ours_' + unit[0]]:.1f}/{r['theirs_' + unit[0]]:.1f} {unit[1]})")
        print(f"{name:<18}" + "".join(f" {cell:>26}" for cell in cells))
    print("  time: medians of", c['reps'], "runs, alternating; memory: bytes saved for backward by one training forward")

# -----------------------------------------------------------------------------
# the two comparisons


def run_t2mlr(T2MLRConfig, T2MLRWrapper, X, Y, prompt, toks, shape, renamed):
    """T2MLR: the official wrapper with our weights. -> dict(agreement, timing)."""
    torch.manual_seed(seed)
    ours = GPT(GPTConfig(**shape, recurrence='t2mlr', rec_start=t2mlr_start, rec_end=t2mlr_end, rec_residual_detach=True))
    with torch.no_grad():  # open the gates: at init tanh(g) = 0 and the recurrence would change nothing
        ours.fusion.g_cur.fill_(0.5)
        ours.fusion.g_rec.fill_(1.0)
    hf = to_hf_llama(ours)  # the backbone, our weights
    hf_params = dict(hf.named_parameters())  # before the wrapper renames the span's layers
    theirs = T2MLRWrapper(T2MLRConfig(
        base_config=hf.config.to_dict(), base_model_type='llama', t2mlr_enabled=True, l_start=t2mlr_start,
        l_end=t2mlr_end, batch_forward=True, batch_forward_approximate_depth=n_iter, batch_backward_approximate_depth=n_grad,
        recurrent_mixing_module_name='gated', use_learnable_gate=True, use_recurrent_projection=True,
        recurrent_residual_to_recurrent_cache=True, recurrent_residual_to_recurrent_cache_detach=True,
        recurrent_residual_to_recurrent_cache_post_norm=True), base_model=hf)
    mixer = theirs.layers[t2mlr_start].t2mlr_mixing_module
    pairs = map_t2mlr(ours, hf_params, mixer)
    ours_params = dict(ours.named_parameters())
    assert {id(p) for ps in pairs.values() for p in ps} == {id(p) for p in theirs.parameters()}, "unmapped official parameters"
    assert n_params(ours) == n_params(theirs), "unmapped parameters of ours"
    cf = torch.full_like(X, 2)  # control flow 2 everywhere: the recurrence on at every position

    def flat_grad(ps):
        return torch.cat([p.grad.reshape(-1) for p in ps])

    def ours_jacobi():
        return ours(X, Y, mode='jacobi', n_iter=n_iter, n_grad=n_grad)[1]

    def theirs_jacobi(use_cache=False):
        """model.train() makes the official forward the Jacobi one (batch_forward); the same cross-entropy.
        use_cache=False: transformers >= 5.24 hands each layer the KV cache as `cache=`, which the official
        Jacobi iterations do not filter out (they drop `past_key_values`), so with the cache the Llama
        config turns on by default (use_cache=None) every iteration also attends to the keys of the
        passes before it. Under older transformers the two calls are the same."""
        logits = theirs(input_ids=X, control_flows=cf, use_cache=use_cache).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), Y.flatten())

    def jacobi_agreement(theirs_loss):
        """-> (loss diff, {our parameter: max |our grad - theirs| / max |theirs|}), our loss, theirs."""
        ours.train(), theirs.train()
        lo, lt = ours_jacobi(), theirs_loss()
        lo.backward(), lt.backward()
        rel = {k: ((ours_params[k].grad.reshape(-1) - flat_grad(ps)).abs().max() / flat_grad(ps).abs().max().clamp_min(1e-30)).item()
               for k, ps in pairs.items()}
        ours.zero_grad(set_to_none=True), theirs.zero_grad(set_to_none=True)
        return abs(lo.item() - lt.item()), rel, lo.item(), lt.item()

    loss_diff, rel, lo, lt = jacobi_agreement(theirs_jacobi)
    worst = max(rel, key=rel.get)
    default_diff, default_rel, _, _ = jacobi_agreement(lambda: theirs_jacobi(None))  # as the official trainer calls it
    ours.eval(), theirs.eval()
    with torch.no_grad():
        exact_o = ours(X, Y, mode='exact')[1].item()
        exact_t = F.cross_entropy(theirs(input_ids=X, control_flows=cf).logits.flatten(0, 1), Y.flatten()).item()
        plain_o = ours(X, Y, mode='plain')[1].item()
    agree = dict(n_params=n_params(ours), jacobi_loss_ours=lo, jacobi_loss_theirs=lt, jacobi_loss_diff=loss_diff,
                 max_rel_grad_diff=rel[worst], worst_param=worst, n_grads=len(rel),
                 default_cache_loss_diff=default_diff, default_cache_max_rel_grad_diff=max(default_rel.values()),
                 exact_loss_ours=exact_o, exact_loss_theirs=exact_t, exact_loss_diff=abs(exact_o - exact_t),
                 recurrence_effect=abs(exact_o - plain_o))
    with torch.no_grad():
        agree['decode_logits_diff'] = (ours_decode(ours, prompt, toks)[1] - theirs_decode(theirs, prompt, toks)[1]).abs().max().item()
        tok_t, calls = greedy_tokens(theirs, mixer, prompt, gen_len, renamed)
        tok_o = ours.generate(prompt, gen_len, temperature=0, prefill='plain')
    agree['generate_mixer_calls'] = calls  # gen_len - 1 when the recurrence ran: every token after the first
    agree['tokens_equal'] = bool(torch.equal(tok_o, tok_t)) if calls else None  # None: not compared (report says why)
    return dict(agreement=agree, timing=timings(
        ours, theirs, ours_jacobi, theirs_jacobi,
        lambda: ours(X, Y, mode='exact'), lambda: theirs(input_ids=X, control_flows=cf),
        lambda: ours_decode(ours, prompt, toks)[0], lambda: theirs_decode(theirs, prompt, toks)[0]))


def run_lrt(lrt_gpt, LRTCache, X, Y, prompt, toks, shape):
    """LRT: the official nanochat GPT at our shape (its own backbone and weights: time only)."""
    block_size = shape['block_size']
    torch.manual_seed(seed)
    ours = GPT(GPTConfig(**shape, recurrence='lrt', rec_start=0, rec_end=-1, lrt_shared=False,  # theirs: one W_fb per layer
                         lrt_gate_channels=lrt_gate_channels))
    theirs = lrt_gpt.GPT(lrt_gpt.GPTConfig(sequence_len=block_size, vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                                           n_kv_head=n_head, n_embd=n_embd, window_pattern='L', use_interleaved=True,
                                           interleaved_num_passes=n_subsets, ve_gate_channels=lrt_gate_channels))
    theirs.init_weights()

    def lrt_steps(m, ids, cache, h):
        """The official sequential recurrence (loss_eval.evaluate_bpb_sequential): one token at a time,
        KV cache, h_final fed back. -> (logits of each token, the last h_final)."""
        logits = []
        for t in range(ids.size(1)):
            lg, h = m(ids[:, t:t + 1], kv_cache=cache, h_final_prev=h, return_hidden=True)
            logits.append(lg)
        return torch.cat(logits, 1), h

    def lrt_cache(b):
        return LRTCache(b, n_head, block_size, n_embd // n_head, n_layer, torch.device('cpu'), torch.float32)

    def lrt_exact():
        return F.cross_entropy(lrt_steps(theirs, X, lrt_cache(X.size(0)), torch.zeros(X.size(0), 1, n_embd))[0].flatten(0, 1), Y.flatten())

    def lrt_decode():
        cache = lrt_cache(1)
        _, h = lrt_steps(theirs, prompt, cache, torch.zeros(1, 1, n_embd))  # the prompt: untimed
        t0 = time.perf_counter()
        lrt_steps(theirs, torch.cat(toks, 1), cache, h)
        return (time.perf_counter() - t0) / len(toks)

    return dict(n_params_ours=n_params(ours), n_params_theirs=n_params(theirs), timing=timings(
        ours, theirs, lambda: ours(X, Y, mode='interleaved', n_subsets=n_subsets)[1],
        lambda: theirs.forward_interleaved_train(X, Y)['loss'],
        lambda: ours(X, Y, mode='exact'), lrt_exact, lambda: ours_decode(ours, prompt, toks)[0], lrt_decode))


def main():
    configure(globals(), config_keys, doc=__doc__)
    check_config()
    torch.set_num_threads(threads)
    T2MLRConfig, T2MLRWrapper = official_import('T2MLR', t2mlr_repo, import_t2mlr,
                                                'components.t2mlr_utils -> components.rcot_utils, an IPython stub')
    lrt_gpt, LRTCache = official_import('LRT', lrt_repo, import_lrt, 'a nanochat.checkpoint_manager stub')
    logging.getLogger().setLevel(logging.WARNING)  # the T2MLR modules set INFO on the root logger
    import transformers
    from transformers import GenerationMixin
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings('ignore', message='.*past_key_values.*')  # the BC rename (>= 5.24), see above
    warnings.filterwarnings('ignore', category=FutureWarning, module='transformers')  # the same rename, in generate

    # the cache argument generate() hands to prepare_inputs_for_generation: `cache` from 5.24.0 on
    renamed = 'past_key_values' not in inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    results = dict(config={k: globals()[k] for k in config_keys},
                   env=dict(torch=torch.__version__, transformers=transformers.__version__,
                            threads=torch.get_num_threads(), t2mlr_commit=commit(t2mlr_repo),
                            lrt_commit=commit(lrt_repo), generate_cache_renamed=renamed))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.get_num_threads()} thread(s); "
          f"T2MLR {results['env']['t2mlr_commit'][:7]}, LRT {results['env']['lrt_commit'][:7]}")

    g = torch.Generator().manual_seed(seed)
    data = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=g)
    X, Y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    prompt = torch.randint(0, vocab_size, (1, prompt_len), generator=g)
    toks = [t.view(1, 1) for t in torch.randint(0, vocab_size, (gen_len,), generator=g)]  # fixed decode inputs
    shape = dict(block_size=max(seq_len, prompt_len + gen_len), vocab_size=vocab_size, n_layer=n_layer, n_head=n_head,
                 n_kv_head=n_head, n_embd=n_embd)
    results['t2mlr'] = run_t2mlr(T2MLRConfig, T2MLRWrapper, X, Y, prompt, toks, shape, renamed)
    results['lrt'] = run_lrt(lrt_gpt, LRTCache, X, Y, prompt, toks, shape)
    report(results)
    line = json.dumps(results)
    if out:
        with open(out, 'w') as f:
            f.write(line + '\n')
    print(line)


if __name__ == '__main__':
    main()
