"""
An independent, deliberately naive reference for the recurrent GPT.

It reads the model's weights but none of its code paths: attention is an explicit
softmax over a full causal mask with GQA by repetition, RoPE tables are built here,
and the recurrence is run the slowest obvious way: for every t, the WHOLE model
runs on the prefix 0..t, each position j <= t reading the state stored for it,
and position t's output gives logits_t and the state for t+1.
"""

import math

import torch


def rms(x, w, eps):
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope(x, theta, positions=None):
    # x: (T, H, hd) at the given positions (default 0..T-1); rotates the pair
    # (j, j + hd/2) by the angle position / theta^(2j/hd)
    T, _, hd = x.shape
    pos = torch.arange(T) if positions is None else torch.as_tensor(positions)
    j = torch.arange(hd // 2, dtype=torch.float64)
    ang = pos.to(torch.float64)[:, None] / theta ** (2 * j / hd)  # (T, hd/2)
    c, s = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
    a, b = x[..., :hd // 2], x[..., hd // 2:]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def attention(model, i, a, mem, on=None):
    # a: (T, d) normed input of block i for ONE sequence at positions 0..T-1; mem: (T, d) or None
    c, att = model.config, model.h[i].attn
    T, hd = a.shape[0], c.n_embd // c.n_head
    q, k, v = qkv(model, i, a, mem, None, on)
    rep = c.n_head // c.n_kv_head
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    ys = []
    for h in range(c.n_head):
        scores = q[:, h] @ k[:, h].T / math.sqrt(hd)
        hide = torch.ones(T, T, dtype=torch.bool).triu(1)  # the future
        if c.attn_window > 0:
            hide |= torch.ones(T, T, dtype=torch.bool).tril(-c.attn_window)  # beyond the window
        scores = scores.masked_fill(hide, float('-inf'))
        ys.append(torch.softmax(scores, -1) @ v[:, h])
    return torch.cat(ys, -1) @ att.wo.weight.T


def block(model, i, x, mem, on=None):
    # on: (T,) bool, where the recurrence is on (None: everywhere)
    c, b = model.config, model.h[i]
    lrt = model.lrt
    if mem is not None and lrt.alpha is not None:
        j = i - c.rec_start
        inj = lrt.alpha[j] * x + lrt.gamma[j] * mem
        x = inj if on is None else torch.where(on[:, None], inj, x)
    x = x + attention(model, i, rms(x, b.ln_1.weight, c.norm_eps), mem, on)
    a = rms(x, b.ln_2.weight, c.norm_eps)
    m = b.mlp
    silu = lambda z: z * torch.sigmoid(z)
    W_gate, W_up = mlp_weights(model, i)
    return x + (silu(a @ W_gate.T) * (a @ W_up.T)) @ m.w_down.weight.T


def mlp_weights(model, i):
    # the model stacks [W_gate; W_up] in one matrix: slice it back
    W = model.h[i].mlp.w_gu.weight
    return W[:model.config.mlp_hidden], W[model.config.mlp_hidden:]


def fuse(model, h, R):
    f = model.fusion
    r = R @ f.w_rec.weight.T if isinstance(f.w_rec, torch.nn.Linear) else R  # (lab: rec_proj=False, r = R)
    hr = torch.cat([h, r], -1)
    sc = torch.sigmoid(hr @ f.f_cur.weight.T + f.f_cur.bias)
    sr = torch.sigmoid(hr @ f.f_rec.weight.T + f.f_rec.bias)
    return h + torch.tanh(f.g_cur.to(h.dtype)) * sc * h + torch.tanh(f.g_rec.to(h.dtype)) * sr * r


def full_model(model, ids, states, on=None):
    """Run every layer on ONE sequence ids (T,), position j reading states[j] (T, d).
    Returns (logits (T, V), h^(rec_end) (T, d))."""
    c = model.config
    x = model.wte.weight[ids]
    h_e = None
    for i in range(c.n_layer):
        if c.recurrence == 't2mlr' and i == c.rec_start:
            f = fuse(model, x, states)
            x = f if on is None else torch.where(on[:, None], f, x)
        mem = states if (c.recurrence == 'lrt' and i >= c.rec_start) else None
        x = block(model, i, x, mem, on)
        if i == c.rec_end:
            h_e = x
    return rms(x, model.ln_f.weight, c.norm_eps) @ model.lm_head.weight.T, h_e


def next_state(model, h, R_prev, off=False):
    """The state a token hands on; off: the token ran as the plain model (T2MLR then
    hands on its raw h, as the official code does)."""
    c = model.config
    if c.recurrence == 't2mlr':
        if off:
            return h
        if getattr(c, 'rec_residual_detach', False):  # the lab model's options (model.py: neither)
            R_prev = R_prev.detach()
        m = h + R_prev if getattr(c, 'rec_residual', True) else h
        # the scale is a constant for autograd (computed under detach in the method)
        return m * min(max(1.0 / math.sqrt(m.pow(2).mean().item() + 1e-6), 0.2), 5.0)
    return rms(h, None, c.norm_eps)


def naive_exact(model, idx, grad=False, rec_mask=None, block_len=1):
    """idx: (B, T). Returns logits (B, T, V) of the exact sequential recurrence
    (differentiable with grad=True, for gradient checks). block_len > 1: naive_block."""
    c = model.config
    out = []
    with torch.set_grad_enabled(grad):
        for b, ids in enumerate(idx):
            T = ids.numel()
            on = None if rec_mask is None else rec_mask[b]
            zero = torch.zeros(c.n_embd, dtype=model.wte.weight.dtype)
            states, rows = [], []  # states[j]: the state token j reads
            prev = zero  # state produced by token t-1
            for t in range(T):
                reset = t == 0 or (c.reset_token is not None and ids[t].item() == c.reset_token)
                off = on is not None and not on[t]  # a plain position reads no state
                inside = t % block_len != 0  # block training: no state inside a chunk
                states.append(zero if reset or off or inside else prev)
                S = torch.stack(states)
                logits, h_e = full_model(model, ids[:t + 1], S, None if on is None else on[:t + 1])
                rows.append(logits[t])
                if c.recurrence != 'none':
                    prev = next_state(model, h_e[t], S[t], off)
            out.append(torch.stack(rows))
    return torch.stack(out)


def naive_block(model, idx, C, rec_mask=None, grad=False):
    """Logits (B, T, V) of block training (DESIGN.md 7, "Block training"): contiguous chunks of
    C tokens in order, the state crossing chunk boundaries only. Stated as naive_exact with one
    change: token t reads the state token t-1 handed on only where a chunk starts (t % C == 0),
    elsewhere 0. C = 1 is the exact recurrence."""
    return naive_exact(model, idx, grad, rec_mask, block_len=C)


def naive_plain(model, idx):
    """The backbone alone (no recurrence), run in parallel."""
    c = model.config
    with torch.no_grad():
        outs = []
        for ids in idx:
            x = model.wte.weight[ids]
            for i in range(c.n_layer):
                x = block(model, i, x, None)
            outs.append(rms(x, model.ln_f.weight, c.norm_eps) @ model.lm_head.weight.T)
    return torch.stack(outs)


# -----------------------------------------------------------------------------
# a naive interleaved-subset scheme (DESIGN.md 7), one sequence, one position at a time

def qkv(model, i, a, mem, positions, on=None):
    """Per-position q, k, v (after RoPE) of block i for rows a (n, d) at positions
    (None: 0..n-1); on: (n,) bool, where the LRT key/value injection applies."""
    c, att = model.config, model.h[i].attn
    n, hd = a.shape[0], c.n_embd // c.n_head
    W = att.wqkv.weight  # the model stacks [W_q; W_k; W_v] in one matrix: slice it back
    d, dkv = c.n_embd, c.n_kv_head * hd
    q = (a @ W[:d].T).view(n, c.n_head, hd)
    k = (a @ W[d:d + dkv].T).view(n, c.n_kv_head, hd)
    v = (a @ W[d + dkv:].T).view(n, c.n_kv_head, hd)
    if mem is not None and model.lrt.gate is not None:
        j = i - c.rec_start
        W_g = model.lrt.gate[j].weight
        g = 2 * torch.sigmoid(a[:, :W_g.shape[1]] @ W_g.T)
        gl, gf = g[:, :c.n_kv_head, None], g[:, c.n_kv_head:, None]  # first Hkv local, then feedback
        W_fb = model.lrt.w_fb[0 if c.lrt_shared else j].weight  # rows: W_fb_k, then W_fb_v
        W_fb_k, W_fb_v = W_fb[:c.n_kv_head * hd], W_fb[c.n_kv_head * hd:]
        kr = gl * k + gf * (mem @ W_fb_k.T).view(n, c.n_kv_head, hd)
        vr = gl * v + gf * (mem @ W_fb_v.T).view(n, c.n_kv_head, hd)
        k = kr if on is None else torch.where(on[:, None, None], kr, k)
        v = vr if on is None else torch.where(on[:, None, None], vr, v)
    if not getattr(c, 'rope', True):  # NoPE (lab/model_full.py)
        return q, k, v
    return rope(q, c.rope_theta, positions), rope(k, c.rope_theta, positions), v


def pass_with_buffer(model, x, positions, states, K, V):
    """Run blocks rec_start..L-1 on rows x (n, d) at positions, each reading states (n, d).
    K[i], V[i]: (T, Hkv, hd) buffers; the fresh keys/values are written into them first,
    then each query attends to buffer rows 0..its own position. Returns (out, h_e)."""
    c = model.config
    rep, hd = c.n_head // c.n_kv_head, c.n_embd // c.n_head
    h_e = None
    for i in range(c.rec_start, c.n_layer):
        b = model.h[i]
        if c.recurrence == 't2mlr' and i == c.rec_start:
            x = fuse(model, x, states)
        mem = states if c.recurrence == 'lrt' else None
        if mem is not None and model.lrt.alpha is not None:
            x = model.lrt.alpha[i - c.rec_start] * x + model.lrt.gamma[i - c.rec_start] * mem
        q, k, v = qkv(model, i, rms(x, b.ln_1.weight, c.norm_eps), mem, positions)
        K[i], V[i] = K[i].clone(), V[i].clone()
        K[i][positions], V[i][positions] = k, v
        rows = []
        for r, p in enumerate(positions):
            heads = []
            for h in range(c.n_head):
                lo = max(0, p + 1 - c.attn_window) if c.attn_window > 0 else 0
                kk, vv = K[i][lo:p + 1, h // rep], V[i][lo:p + 1, h // rep]
                heads.append(torch.softmax(kk @ q[r, h] / math.sqrt(hd), -1) @ vv)
            rows.append(torch.cat(heads))
        x = x + torch.stack(rows) @ b.attn.wo.weight.T
        a = rms(x, b.ln_2.weight, c.norm_eps)
        m = b.mlp
        W_gate, W_up = mlp_weights(model, i)
        x = x + ((a @ W_gate.T) * torch.sigmoid(a @ W_gate.T) * (a @ W_up.T)) @ m.w_down.weight.T
        if i == c.rec_end:
            h_e = x
    return x, h_e


def naive_interleaved(model, idx, S, rounds=1):
    """Logits (B, T, V) of the interleaved scheme, the S subsets refined `rounds` times
    over: each position from the last pass that refined it."""
    c = model.config
    hd = c.n_embd // c.n_head
    out = []
    with torch.no_grad():
        for ids in idx:
            T = ids.numel()
            x = model.wte.weight[ids]
            for i in range(c.rec_start):
                x = block(model, i, x, None)
            xs = x
            K = {i: torch.zeros(T, c.n_kv_head, hd, dtype=x.dtype) for i in range(c.n_layer)}
            V = {i: torch.zeros(T, c.n_kv_head, hd, dtype=x.dtype) for i in range(c.n_layer)}
            zero = torch.zeros(T, c.n_embd, dtype=x.dtype)
            _, h_e = pass_with_buffer(model, xs, list(range(T)), zero, K, V)  # init pass
            latest = torch.stack([next_state(model, h_e[t], zero[t]) for t in range(T)])
            logits = torch.zeros(T, c.vocab_size, dtype=x.dtype)
            for i in [i for _ in range(rounds) for i in range(S)]:
                P = list(range(i, T, S))
                st = torch.stack([torch.zeros(c.n_embd, dtype=x.dtype)
                                  if p == 0 or (c.reset_token is not None and ids[p].item() == c.reset_token)
                                  else latest[p - 1] for p in P])
                y, h_e = pass_with_buffer(model, xs[P], P, st, K, V)
                for r, p in enumerate(P):
                    latest[p] = next_state(model, h_e[r], st[r])
                logits[P] = rms(y, model.ln_f.weight, c.norm_eps) @ model.lm_head.weight.T
            out.append(logits)
    return torch.stack(out)
