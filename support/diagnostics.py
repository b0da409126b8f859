"""
Watching a model: what train.py, lab/evaluate.py and lab/compare.py measure besides the loss. Nothing
here changes what the model computes: the recurrence is observed through forward hooks.

  watch(model)          a context: forward hooks keep the state each token reads and the gates
  gate_stats(model, x)  the gates and the state as scalars (train.py's gates/... log entries)
  trace_values(...)     per position of one input: state, gates, exact and zero-state predictions
  task_accuracy(...)    teacher-forced token accuracy and exact match on labelled task rows
  jacobi_profile(...)   how fast Jacobi iterations reach the exact states of a trained model
  activation_bytes(fn)  the bytes autograd saves for backward while fn() runs (lab/memory.py, lab/official.py)
"""

import math
import weakref
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
import torch.nn.functional as F



def masked(rec_mask):
    """The forward's rec_mask keyword where there is a prompt mask (only lab/model_full.py takes one)."""
    return {} if rec_mask is None else dict(rec_mask=rec_mask)

# -----------------------------------------------------------------------------
# memory

def activation_bytes(fn, exclude=()):
    """Bytes of the tensors autograd holds for backward when fn() returns (its result kept alive
    until they are counted), once per storage, the storages of the tensors in exclude (a model's
    parameters and buffers) left out: the activation memory of a training step. What a part of
    the graph saved and freed during the forward (a pass computed with gradient, then detached)
    is transient and not counted. Unlike RSS it is exact and per call, on any device (a
    process's peak RSS only ever grows, so it cannot be split between models)."""
    saved = []

    def pack(t):
        # detached: a saved output returned as itself would hold its own grad_fn, a cycle in C++
        # that no gc frees (about 1 GB per measured 135M config); autograd re-attaches it on unpack
        t = t.detach()
        saved.append(weakref.ref(t))  # alive as long as the graph node that saved it
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    held = {}
    for ref in saved:
        t = ref()
        if t is not None:
            try:
                st = t.untyped_storage()
                held[st.data_ptr()] = st.nbytes()
            except (RuntimeError, NotImplementedError):
                pass
    del out
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    return sum(n for p, n in held.items() if p not in skip)


# -----------------------------------------------------------------------------
# forward hooks

@contextmanager
def watch(model):
    """with watch(model) as rec: model(idx, mode='exact') -- rec[key] is the list of values the
    hooks saw, in call order; values(rec, key) joins them along positions. Keys:
      'state'             (B, T, d) the state read at block s (R_{t-1} for T2MLR, m_{t-1} for LRT)
      'gate_cur', 'gate_rec'   T2MLR's tanh(g) sigmoid(f([h, r])), (B, T, d)
      'g.<layer>'         LRT's (g_loc, g_fb) = 2 sigmoid(W_g a), (B, T, 2, Hkv)
      'gamma_m.<layer>', 'alpha_x.<layer>'   norms over channels of LRT's two residual terms, (B, T)
    Joining along positions is right for the exact forward (and the zero-state one), which
    runs the span once per position in order and every other block once over the sequence.
    The hooks are removed on exit: the model is as before."""
    rec, handles = {}, []
    keep = lambda key, v: rec.setdefault(key, []).append(v.detach())
    if model.fusion is not None:
        f = model.fusion
        handles.append(f.register_forward_hook(lambda mod, args, out: keep('state', args[1])))
        for name in ('cur', 'rec'):  # the hook sees f([h, r]); the gate is tanh(g) sigmoid(that)
            g = getattr(f, f'g_{name}')
            handles.append(getattr(f, f'f_{name}').register_forward_hook(
                lambda mod, args, out, g=g, name=name: keep(f'gate_{name}', torch.tanh(g.double()) * torch.sigmoid(out.double()))))
    if model.lrt is not None:
        lrt, s = model.lrt, model.s

        def state(mod, args):  # args: Block.forward's (x, rope, pos, mask, cache, state_in)
            if args[5] is not None:
                keep('state', args[5].state)
        handles.append(model.h[s].register_forward_pre_hook(state))
        for j, i in enumerate(range(s, model.config.n_layer)):
            if lrt.gate is not None:
                handles.append(lrt.gate[j].register_forward_hook(
                    lambda mod, args, out, i=i: keep(f'g.{i}', (2 * torch.sigmoid(out)).unflatten(-1, (2, lrt.Hkv)))))
            if lrt.alpha is not None:
                def terms(mod, args, i=i, j=j):  # args: Block.forward's (x, rope, pos, mask, cache, state_in)
                    x, state_in = args[0], args[5]
                    if state_in is not None:
                        keep(f'gamma_m.{i}', lrt.gamma[j].double().abs() * state_in.state.double().norm(dim=-1))
                        keep(f'alpha_x.{i}', lrt.alpha[j].double().abs() * x.double().norm(dim=-1))
                handles.append(model.h[i].register_forward_pre_hook(terms))
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


def values(rec, key):
    """The values kept under key as one (B, T, ...) tensor, joined along positions."""
    return torch.cat(rec[key], 1)

# -----------------------------------------------------------------------------
# gate statistics (train.py's evaluation logs them)

@torch.no_grad()
def gate_stats(model, x, m=None, ctx=nullcontext()):
    """What the gates do on a batch x (B, T) run exactly, as scalars (means over rows, positions
    where the recurrence is on, and channels; in float64, so a huge state is a huge number, not
    an overflow). T2MLR: gates/cur, gates/rec (tanh(g) sigmoid(f([h, r]))), gates/tanh_g_cur,
    gates/tanh_g_rec. LRT, per reading layer i and as a mean over them: gates/g_loc.i,
    gates/g_fb.i, gates/gamma.i, gates/alpha.i. Both: gates/state, the mean norm of the state read.
    T2MLR also: gates/scale_at_min and gates/scale_at_max, the fractions of the (non-zero) states
    read whose RMS scale clamp(1/rms(m), min, max) sat at a bound. Unclamped, R = m / rms(m) has
    RMS 1; at the lower bound (m too large) its RMS is above 1, at the upper (m too small) below."""
    was_training = model.training
    model.eval()
    with watch(model) as rec, ctx:
        model(x, mode='exact', **masked(m))
    model.train(was_training)
    mean = lambda t: (t if m is None else t[m]).double().mean().item()
    out = {'gates/state': mean(values(rec, 'state').double().norm(dim=-1))}
    if model.fusion is not None:
        f = model.fusion
        out['gates/cur'], out['gates/rec'] = mean(values(rec, 'gate_cur')), mean(values(rec, 'gate_rec'))
        out['gates/tanh_g_cur'], out['gates/tanh_g_rec'] = math.tanh(f.g_cur.item()), math.tanh(f.g_rec.item())
        rms = values(rec, 'state').double().pow(2).mean(-1).sqrt()  # (B, T)
        on = rms > 0 if m is None else (rms > 0) & m  # zero states (t = 0, resets) have no scale
        n = on.sum().clamp(min=1).item()
        out['gates/scale_at_min'] = ((rms > 1 + 1e-3) & on).sum().item() / n
        out['gates/scale_at_max'] = ((rms < 1 - 1e-3) & on).sum().item() / n
        return out
    per, lrt = {}, model.lrt
    for j, i in enumerate(range(model.s, model.config.n_layer)):
        if f'g.{i}' in rec:
            g = values(rec, f'g.{i}')  # (B, T, 2, Hkv)
            per.setdefault('g_loc', {})[i], per.setdefault('g_fb', {})[i] = mean(g[..., 0, :]), mean(g[..., 1, :])
        if lrt.alpha is not None:
            per.setdefault('gamma', {})[i], per.setdefault('alpha', {})[i] = lrt.gamma[j].item(), lrt.alpha[j].item()
    for name, vals in per.items():
        out[f'gates/{name}'] = sum(vals.values()) / len(vals)
        out.update({f'gates/{name}.{i}': v for i, v in vals.items()})
    return out

# -----------------------------------------------------------------------------
# trace: the recurrence at work on one input (lab/evaluate.py --trace)

@torch.no_grad()
def trace_values(model, idx, labels=None, rec_mask=None):
    """idx: (1, T). Runs the exact recurrence once under watch() and the zero-state forward once.
    Returns {column: list over positions}: the state read (norm, first principal component),
    the gates (T2MLR: mean and spread over channels of tanh(g) sigmoid(f); LRT: g_loc and g_fb
    per reading layer, |gamma m| and |alpha x|), the exact and the zero-state prediction."""
    T = idx.size(1)
    with watch(model) as rec:
        logits, _ = model(idx, mode='exact', **masked(rec_mask))
    zero_logits, _ = model(idx, mode='zero', **masked(rec_mask))
    prob = torch.softmax(logits[0].double(), -1)
    state = values(rec, 'state')[0]  # (T, d) the state each position read
    cols = {'pos': list(range(T)), 'token': idx[0].tolist(), 'state_norm': state.double().norm(dim=-1).tolist(),
            'state_pc1': state_pc1(state).tolist()}
    if model.fusion is not None:
        for name in ('cur', 'rec'):
            g = values(rec, f'gate_{name}')[0]  # (T, d)
            cols[f'gate_{name}_mean'] = g.mean(-1).tolist()
            cols[f'gate_{name}_std'] = g.std(-1, correction=0).tolist()  # spread over channels
    else:
        for i in range(model.s, model.config.n_layer):
            if f'g.{i}' in rec:
                g = values(rec, f'g.{i}')[0]  # (T, 2, Hkv), mean over the KV heads
                cols[f'g_loc.{i}'], cols[f'g_fb.{i}'] = g[:, 0].mean(-1).tolist(), g[:, 1].mean(-1).tolist()
            if f'gamma_m.{i}' in rec:
                cols[f'gamma_m.{i}'] = values(rec, f'gamma_m.{i}')[0].tolist()
                cols[f'alpha_x.{i}'] = values(rec, f'alpha_x.{i}')[0].tolist()
    cols['pred'] = logits[0].argmax(-1).tolist()
    cols['p_pred'] = prob.max(-1).values.tolist()
    cols['pred_zero'] = zero_logits[0].argmax(-1).tolist()
    if labels is not None:
        cols['label'] = labels
    return cols


def state_pc1(state):
    """(T, d) -> (T,): each state's coordinate along the first principal direction of this
    input's nonzero states (centred over those positions; the zero state at t = 0 or at a reset
    would dominate it); sign fixed so the largest coordinate is positive. A state that tracks
    a binary quantity (parity) shows it here as two levels."""
    s = state.double()
    fit = s[s.norm(dim=-1) > 0]
    if len(fit) < 2:
        return torch.zeros(len(s), dtype=torch.float64)
    mu = fit.mean(0)
    pc = (s - mu) @ torch.linalg.svd(fit - mu, full_matrices=False).Vh[0]
    return pc * torch.sign(pc[pc.abs().argmax()])


def plot_trace(cols, path, title):
    """Panels over positions: state read; gates; (LRT) |gamma m| / |alpha x|; prediction vs label."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    pos = cols['pos']
    lrt_res = sorted(k for k in cols if k.startswith('gamma_m.'))
    n = 3 + bool(lrt_res)
    fig, axes = plt.subplots(n, 1, figsize=(max(6.0, 0.16 * len(pos)), 1.9 * n + 0.6), sharex=True)
    axes[0].plot(pos, cols['state_norm'], marker='.', color='k', label='norm')
    axes[0].plot(pos, cols['state_pc1'], marker='.', color='tab:purple', label='1st principal component')
    axes[0].set_ylabel('state read')
    axes[0].legend(fontsize=7, loc='best')
    ax = axes[1]
    if 'gate_cur_mean' in cols:
        for name, color in (('cur', 'tab:blue'), ('rec', 'tab:red')):
            m, s = np.array(cols[f'gate_{name}_mean']), np.array(cols[f'gate_{name}_std'])
            ax.plot(pos, m, marker='.', color=color, label=f'tanh(g_{name}) sigmoid(f_{name})')
            ax.fill_between(pos, m - s, m + s, color=color, alpha=0.2)
        ax.set_ylabel('gate (mean ± std\nover channels)')
    else:
        for k in sorted(k for k in cols if k.startswith(('g_loc.', 'g_fb.'))):
            ax.plot(pos, cols[k], marker='.', ls='-' if k.startswith('g_fb') else ':', label=k)
        ax.set_ylabel('LRT gates')
    ax.legend(fontsize=7, loc='best')
    if lrt_res:
        ax = axes[2]
        for k in lrt_res:
            i = k.split('.')[1]
            ax.plot(pos, np.array(cols[k]) / np.maximum(np.array(cols[f'alpha_x.{i}']), 1e-12), marker='.', label=f'layer {i}')
        ax.set_ylabel('|gamma m| / |alpha x|')
        ax.legend(fontsize=7, loc='best')
    ax = axes[-1]
    if 'label' in cols:
        lab = [(p, l) for p, l in zip(pos, cols['label']) if l != -1]
        ax.plot([p for p, _ in lab], [l for _, l in lab], 's', mfc='none', ms=8, color='gray', label='label')
    ax.plot(pos, cols['pred'], 'o', ms=4, color='tab:green', label='prediction (exact)')
    ax.plot(pos, cols['pred_zero'], 'x', ms=4, color='tab:orange', label='prediction (zero state)')
    ax.set_ylabel('token id')
    ax.set_xlabel('position')
    ax.legend(fontsize=7, loc='best', ncol=3)
    axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)

# -----------------------------------------------------------------------------
# teacher-forced accuracy on labelled task rows (train.py's evaluation, lab/evaluate.py --eval_split)

@torch.no_grad()
def eval_modes(train_mode, recurrent=True):
    """The forwards every evaluation reports, as (tag, mode): the exact recurrence (what generation
    computes), the training scheme's approximation, and the exact one on a zero state (the
    reliance gap zero - exact). A model without recurrence has one: the plain forward."""
    return [('exact', 'exact'), ('approx', train_mode), ('zero', 'zero')] if recurrent else [('exact', 'plain')]


def task_accuracy(model, X, Y, M=None, mode='exact', batch_size=256, ctx=nullcontext(), kinds=None, engine=None, **scheme):
    """X, Y: (n, T) arrays of inputs and aligned labels (-1 = none); M: optional (n, T) recurrence
    mask (prompt/response data: the labelled positions are the response). One forward per batch
    in `mode` (scheme: its n_iter, ...). -> dict: loss (mean cross-entropy over labelled
    positions), acc (token accuracy over labelled positions),
    em (rows with every labelled position right), pos_acc (T,) accuracy by position, step_acc
    (right at t given right at t-1, over labelled pairs: a tracker that learned the step with
    accuracy p decays like p^t). kinds: {name: (T,) bool} -> also acc_<name>, the accuracy at
    those positions (s5_retrieval: the states and the values, tasks.position_kinds). engine: an
    engine.Engine of the model that runs the forward instead (train.py's compiled exact modes)."""
    device = model.lm_head.weight.device
    n, T = X.shape
    right_n = labelled_n = em = kept = prev = 0
    loss_sum, kind_right = 0.0, {name: 0 for name in kinds or {}}
    pos_right, pos_n = torch.zeros(T, dtype=torch.float64), torch.zeros(T, dtype=torch.float64)
    for i in range(0, n, batch_size):
        x = torch.from_numpy(np.asarray(X[i:i + batch_size], dtype=np.int64)).to(device)
        y = torch.from_numpy(np.asarray(Y[i:i + batch_size], dtype=np.int64)).to(device)
        m = None if M is None else torch.from_numpy(np.asarray(M[i:i + batch_size], dtype=np.bool_)).to(device)
        with ctx:
            logits = (engine or model)(x, mode=mode, **masked(m), **scheme)[0]
        mask = y != -1
        loss_sum += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=-1, reduction='sum').item()
        right = (logits.argmax(-1) == y) & mask
        right_n += right.sum().item()
        labelled_n += mask.sum().item()
        em += (right.sum(1) == mask.sum(1)).sum().item()
        pos_right += right.sum(0).cpu().double()
        for name, where in (kinds or {}).items():
            kind_right[name] += right[:, torch.from_numpy(np.asarray(where)).to(device)].sum().item()
        pos_n += mask.sum(0).cpu().double()
        both = mask[:, 1:] & mask[:, :-1]
        prev += (right[:, :-1] & both).sum().item()
        kept += (right[:, 1:] & right[:, :-1] & both).sum().item()
    kind_n = {name: pos_n[torch.from_numpy(np.asarray(where))].sum().item() for name, where in (kinds or {}).items()}
    return dict(**{f'acc_{name}': kind_right[name] / max(kind_n[name], 1) for name in kind_right},
                loss=loss_sum / max(labelled_n, 1), acc=right_n / max(labelled_n, 1), em=em / max(n, 1), right=right_n, labelled=labelled_n,
                pos_acc=(pos_right / pos_n.clamp(min=1)).tolist(), pos_n=pos_n.tolist(),
                step_acc=kept / prev if prev else None)

# -----------------------------------------------------------------------------
# Jacobi convergence on a trained model (lab/evaluate.py --jacobi_profile)

@torch.no_grad()
def jacobi_profile(model, X, M=None, K=None, rtol=1e-3, batch_size=64):
    """How fast Jacobi iterations reach the exact recurrence on rows X (n, T) (M: optional
    recurrence mask). For k = 1..K (default T) runs model's Jacobi with D = k (model._jacobi's
    guess, steps and final pass, the training schedule) and compares the states its final pass reads, and its predictions,
    with the exact sequential recurrence's. A state is exact when ||s - s*|| <= rtol ||s*||.
    The worst case (a state that never contracts) is one more exact position per iteration.
    -> list over k of dict(k, state_exact: fraction of positions, pred_exact: fraction of
    positions with the exact argmax, prefix: mean over rows of the exact prefix length (leading
    positions all exact), prefix_min, max_change: the largest |state_k - state_{k-1}|)."""
    model.eval()
    device = model.lm_head.weight.device
    n, T = X.shape
    K = K or T
    sums = [dict(k=k, state_exact=0.0, pred_exact=0.0, prefix=0.0, prefix_min=T, max_change=0.0) for k in range(1, K + 1)]
    for i in range(0, n, batch_size):
        idx = torch.from_numpy(np.asarray(X[i:i + batch_size], dtype=np.int64)).to(device)
        m = None if M is None else torch.from_numpy(np.asarray(M[i:i + batch_size], dtype=np.bool_)).to(device)
        exact_pred, _, exact_states = model._sequential(idx, None, 1, None, m)
        exact_pred, exact_states = exact_pred.argmax(-1), model.shift_states(exact_states, idx, m)  # the states read
        x = model.below(idx)
        states = model._jacobi_guess(x, idx, m)  # D = 1: the guess alone; each D after it one iteration more
        prev = None
        for r in sums:
            if prev is not None and model.config.jacobi_init != 'exact':  # (from the exact states: none run)
                states = model._jacobi_step(x, idx, states, m)
            err = (states - exact_states).double().norm(dim=-1)
            ok = err <= rtol * exact_states.double().norm(dim=-1)  # (B, T); a zero state must match exactly
            prefix = ok.long().cumprod(1).sum(1)  # leading exact positions per row
            r['state_exact'] += ok.sum().item()
            r['pred_exact'] += (model._jacobi_final(x, idx, states, None, m)[0].argmax(-1) == exact_pred).sum().item()
            r['prefix'] += prefix.sum().item()
            r['prefix_min'] = min(r['prefix_min'], prefix.min().item())
            if prev is not None:
                r['max_change'] = max(r['max_change'], (states - prev).abs().max().item())
            prev = states
    for r in sums:
        r['state_exact'], r['pred_exact'], r['prefix'] = r['state_exact'] / (n * T), r['pred_exact'] / (n * T), r['prefix'] / n
    sums[0]['max_change'] = None  # no iteration before the first
    return sums


def plot_jacobi_profile(profiles, path, T):
    """profiles: {label: jacobi_profile rows} -> the exact prefix against k, one line per model,
    with the worst case (k positions for jacobi_init='plain') drawn in."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    K = max(len(rows) for rows in profiles.values())
    axes[0].plot(range(1, K + 1), [min(k, T) for k in range(1, K + 1)], 'k--', lw=1, label='k positions (worst case)')
    for label, rows in profiles.items():
        ks = [r['k'] for r in rows]
        axes[0].plot(ks, [r['prefix'] for r in rows], marker='.', label=label)
        axes[1].plot(ks, [r['state_exact'] for r in rows], marker='.', label=label)
    axes[0].set_ylabel('exact prefix (mean over rows)')
    axes[1].set_ylabel('fraction of positions with the exact state')
    for ax in axes:
        ax.set_xlabel('Jacobi iterations D')
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)

# -----------------------------------------------------------------------------
# a token corpus, read whole (lab/evaluate.py --eval_split on text, lab/compare.py's text table)

@torch.no_grad()
def corpus_loss(model, data, T, mode='exact', batch_size=32, max_windows=0, ctx=nullcontext(), **scheme):
    """The mean next-token loss (nats) over a token stream data (1-D array), cut into consecutive
    windows of T + 1 tokens (every token predicted once; max_windows > 0: the first ones only). Each
    window starts from the zero state, as in training; reset tokens inside it reset the state.
    -> (loss, tokens scored)."""
    device = model.lm_head.weight.device
    n = (len(data) - 1) // T
    n = min(n, max_windows) if max_windows > 0 else n
    total, count = 0.0, 0
    for i in range(0, n, batch_size):
        rows = np.stack([np.asarray(data[j * T:j * T + T + 1], dtype=np.int64) for j in range(i, min(n, i + batch_size))])
        x, y = torch.from_numpy(rows[:, :-1]).to(device), torch.from_numpy(rows[:, 1:]).to(device)
        with ctx:
            loss = model(x, y, mode=mode, **scheme)[1]
        total += loss.item() * y.numel()
        count += y.numel()
    return total / max(count, 1), count
