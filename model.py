"""
A GPT with latent token-to-token recurrence: the two papers' method in one file (torch only).
A Llama-style decoder plus one constant-size state: the hidden state of token t-1 at a source
layer e (rec_end) is fed into an earlier layer s (rec_start) of token t (docs/DESIGN.md 3, 4):
  't2mlr'  a gated fusion Phi(h, R) at the input of block s; R_t read after block e
  'lrt'    the memory m_t = rmsnorm(h^(e)_t) injected into every block >= s (residual, key, value)
Layers are 0-based; h^(l)_t is the residual stream at the OUTPUT of block l for token t.
  below = blocks 0..s-1 (never read the state: parallel), span = blocks s..e (the recurrence),
  above = blocks e+1..L-1 (read the state (LRT) or not (T2MLR), never feed it: parallel).
Every path is built on one primitive, run_blocks. Read in order: config, backbone, the two
fusions, the model (exact loop, Jacobi, interleaved, generation), the KV cache, the helpers.
The research model (official-code options, block training, masks) is lab/model_full.py.
"""

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# config

@dataclass
class GPTConfig:
    block_size: int = 1024      # max sequence length (the RoPE table; prompt + generated tokens)
    vocab_size: int = 50304     # the tokens that exist: logits and loss cover exactly these
    vocab_pad: int = 1          # embedding rows rounded up to a multiple of this (128: a fast LM head)
    n_layer: int = 4            # L blocks
    n_head: int = 4
    n_kv_head: int = 4          # < n_head: grouped-query attention
    n_embd: int = 64            # d
    attn_window: int = 0        # > 0: a token attends to the last attn_window tokens only (itself included)
    reset_token: Optional[int] = None  # the token that starts a document: the state it reads is 0
    recurrence: str = 'none'    # 'none' (the plain GPT) | 't2mlr' | 'lrt'
    rec_start: int = 0          # s: the first block that reads the state
    rec_end: int = -1           # e: the block whose output is the state; -1 = the last
    rec_gate_init: float = 0.0  # T2MLR: g_rec at init (0: Phi is the identity, the model starts plain)
    jacobi_init: str = 'plain'  # Jacobi's first guess: 'plain' (the span without the state, as the official code) or 'exact'
    lrt_shared: bool = True     # LRT: one W_fb for every reading layer (the paper's LRT-shared), else one per layer
    # fixed here, settings in lab/model_full.py
    jacobi_inits = ('plain', 'exact')
    norm_eps = 1e-5
    rec_gate_gain = 1.0  # the xavier gain of T2MLR's f_cur, f_rec
    rope_theta = 10000.0
    tie_embeddings = True

    def __post_init__(self):
        self.rec_end = self.n_layer - 1 if self.rec_end == -1 else self.rec_end
        self.mlp_hidden = 64 * math.ceil(8 * self.n_embd / 3 / 64)  # SwiGLU width: 8/3 d, rounded up to 64
        self.validate()

    @property
    def padded_vocab(self):
        return self.vocab_pad * math.ceil(self.vocab_size / self.vocab_pad)

    def validate(self):  # every broken setting: one ValueError naming it
        c, L, hd = self, self.n_layer, self.n_embd // max(1, self.n_head)
        for ok, msg in [
                (min(c.block_size, c.vocab_size, L, c.n_head, c.n_kv_head, c.n_embd) >= 1, "sizes must be >= 1"),
                (c.n_embd % c.n_head == 0 and c.n_head % c.n_kv_head == 0 and hd % 2 == 0,
                 f"n_embd={c.n_embd}, n_head={c.n_head}, n_kv_head={c.n_kv_head}: need n_head | n_embd, "
                 "n_kv_head | n_head and an even head dim (RoPE)"),
                (1 <= c.vocab_pad <= 4096, f"vocab_pad={c.vocab_pad} must be in 1..4096 (128 is the usual)"),
                (c.attn_window >= 0, f"attn_window={c.attn_window} must be >= 0 (0 = full causal attention)"),
                (c.reset_token is None or 0 <= c.reset_token < c.vocab_size, f"reset_token={c.reset_token} is not a token id"),
                (c.recurrence in ('none', 't2mlr', 'lrt'), f"unknown recurrence {c.recurrence!r}; expected 'none', 't2mlr' or 'lrt'"),
                (math.isfinite(c.rec_gate_init), f"rec_gate_init={c.rec_gate_init} must be finite"),
                (c.jacobi_init in self.jacobi_inits, f"unknown jacobi_init {c.jacobi_init!r}; expected one of {self.jacobi_inits}"),
                (c.recurrence == 'none' or 0 <= c.rec_start <= c.rec_end < L,
                 f"rec_start={c.rec_start}, rec_end={c.rec_end}: need 0 <= rec_start <= rec_end < n_layer={L} (-1: the last)")]:
            if not ok:
                raise ValueError(f"GPTConfig: {msg}")

# -----------------------------------------------------------------------------
# backbone: RMSNorm, RoPE, grouped-query attention, SwiGLU

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)

def rope_tables(head_dim, max_len, theta):
    # Llama's RoPE: frequencies repeated over the two halves of a head -> cos, sin (max_len, hd),
    # in the default dtype (float64 when a test builds the model so)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    emb = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq).repeat(1, 2)
    sign = torch.cat([-torch.ones(head_dim // 2), torch.ones(head_dim // 2)]).to(torch.float64)
    return emb.cos().to(torch.get_default_dtype()), (emb.sin() * sign).to(torch.get_default_dtype())

def apply_rope(x, cos, sin):
    # x: (B, T, H, hd); cos, sin: (T, 1, hd). x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]
    # = roll(x, hd/2) with the sign in the sin table
    return x * cos.to(x.dtype) + x.roll(x.size(-1) // 2, -1) * sin.to(x.dtype)

def attend(q, k, v, mask):
    """softmax(q k^T / sqrt(hd)) v. q: (B, H, Tq, hd); k, v: (B, Hkv, Tk, hd), query head h reads KV head
    h // G, G = H / Hkv. mask (Tq, Tk) bool, or None: causal. With a mask the G query heads of a KV
    head fold into the query axis: one fused kernel, no copy of K/V."""
    B, H, Tq, hd = q.shape
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=Tq > 1, enable_gqa=True)
    G = H // k.size(1)
    return F.scaled_dot_product_attention(q.reshape(B, -1, G * Tq, hd), k, v, attn_mask=mask.repeat(G, 1)).view(B, H, Tq, hd)

class Attention(nn.Module):
    def __init__(self, config, i):
        super().__init__()
        self.i, self.n_head, self.n_kv_head = i, config.n_head, config.n_kv_head  # i: the slot in the KV cache
        self.hd = config.n_embd // config.n_head
        self.wqkv = nn.Linear(config.n_embd, config.n_embd + 2 * self.n_kv_head * self.hd, bias=False)  # [W_q; W_k; W_v]
        self.wo = nn.Linear(config.n_embd, config.n_embd, bias=False)

    def forward(self, a, rope, pos, mask, cache, state_in=None):
        # a: (B, T, d) the normed block input of the tokens at positions pos
        B, T, _ = a.shape
        H, Hkv = self.n_head, self.n_kv_head
        qkv = self.wqkv(a).view(B, T, H + 2 * Hkv, self.hd)  # heads: H of q, Hkv of k, Hkv of v
        if state_in is not None:
            qkv = state_in.gated_kv(self.i, a, qkv)  # LRT: k <- g_loc k + g_fb W_fb_k m_{t-1}, same for v
        q, k = apply_rope(qkv[:, :, :H + Hkv], *rope).split([H, Hkv], 2)
        v = qkv[:, :, H + Hkv:]
        if torch.is_grad_enabled():
            v = v.contiguous()  # else backward keeps the whole qkv storage alive through this view
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, hd)
        if cache is not None:  # -> (B, Hkv, keys, hd): every key the queries may see
            k, v = cache.write(self.i, pos, k, v)
        return self.wo(attend(q, k, v, mask).transpose(1, 2).reshape(B, T, -1))

class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_gu = nn.Linear(config.n_embd, 2 * config.mlp_hidden, bias=False)  # [W_gate; W_up]
        self.w_down = nn.Linear(config.mlp_hidden, config.n_embd, bias=False)

    def forward(self, x):  # SwiGLU: W_down (silu(W_gate x) * W_up x)
        gate, up = self.w_gu(x).chunk(2, dim=-1)
        return self.w_down(F.silu(gate) * up)

class Block(nn.Module):
    def __init__(self, config, i):
        super().__init__()
        self.i = i
        self.ln_1, self.attn = RMSNorm(config.n_embd, config.norm_eps), Attention(config, i)
        self.ln_2, self.mlp = RMSNorm(config.n_embd, config.norm_eps), MLP(config)

    def forward(self, x, rope, pos, mask, cache, state_in=None):
        if state_in is not None:  # T2MLR's fusion at block s, LRT's residual at blocks >= s
            x = state_in.enter(self.i, x)
        x = x + self.attn(self.ln_1(x), rope, pos, mask, cache, state_in)
        return x + self.mlp(self.ln_2(x))

# -----------------------------------------------------------------------------
# T2MLR: gated fusion at the input of block s (DESIGN.md 3)

class T2MLRFusion(nn.Module):
    """Phi(h, R) = h + tanh(g_cur) sigmoid(f_cur([h, r])) * h + tanh(g_rec) sigmoid(f_rec([h, r])) * r,
    r = W_rec R. g_cur = g_rec = 0 at init: Phi is the identity, the model starts as the plain GPT."""

    def __init__(self, config):
        super().__init__()
        d = config.n_embd
        self.w_rec = nn.Linear(d, d, bias=False)
        self.f_cur, self.f_rec = nn.Linear(2 * d, d), nn.Linear(2 * d, d)
        self.g_cur = nn.Parameter(torch.zeros((), dtype=torch.float32))  # fp32 scalars (bf16 is autocast)
        self.g_rec = nn.Parameter(torch.zeros((), dtype=torch.float32))

    def forward(self, h, R):
        # h: (B, T, d) the input of block s; R: (B, T, d) the state each token reads, R_{t-1}
        r = self.w_rec(R)
        hr = torch.cat([h, r], dim=-1)
        wide = torch.promote_types(torch.float32, h.dtype)  # tanh in at least fp32
        g_cur, g_rec = (torch.tanh(g.to(wide)).to(h.dtype) for g in (self.g_cur, self.g_rec))
        return h + g_cur * torch.sigmoid(self.f_cur(hr)) * h + g_rec * torch.sigmoid(self.f_rec(hr)) * r

    def init_weights(self, g_rec, gain=1.0):
        nn.init.constant_(self.g_rec, g_rec)  # > 0: the recurrent path open from the start (docs/recipe.md)
        for f in (self.f_cur, self.f_rec):
            nn.init.xavier_normal_(f.weight, gain=gain)
            nn.init.zeros_(f.bias)  # sigmoid(0) = 0.5, as the official recipes
        self.w_rec.reset_parameters()  # PyTorch's default Linear init, as the official code

# -----------------------------------------------------------------------------
# LRT: the memory injected into every block >= s (DESIGN.md 4)

class LRT(nn.Module):
    """The memory m_{t-1} = rmsnorm(h^(e)_{t-1}) enters every reading block i >= s (the j-th, j = i - s):
      residual   x <- alpha_j x + gamma_j m   at the block input
      key/value  k = g_loc W_k a + g_fb W_fb_k m,  v = g_loc W_v a + g_fb W_fb_v m, with
                 (g_loc, g_fb) = 2 sigmoid(W_g,j a) per KV head, a the normed block input:
                 a gated addition to the token's OWN key and value, so the cache keeps its shape."""

    def __init__(self, config, s):
        super().__init__()
        c, n = config, config.n_layer - s  # n reading layers
        self.shared, self.Hkv, self.hd = c.lrt_shared, c.n_kv_head, c.n_embd // c.n_head
        self.w_fb = nn.ModuleList([nn.Linear(c.n_embd, 2 * c.n_kv_head * self.hd, bias=False)  # [W_fb_k; W_fb_v]
                                   for _ in range(1 if c.lrt_shared else n)])
        self.gate = nn.ModuleList([nn.Linear(c.n_embd, 2 * c.n_kv_head, bias=False) for _ in range(n)])
        self.alpha = nn.Parameter(torch.ones(n))
        self.gamma = nn.Parameter(torch.full((n,), 0.1))

    def init_weights(self):  # the gates start at 2 sigmoid(0) = 1
        for lin in self.gate:
            nn.init.zeros_(lin.weight)

    def project(self, j, m):  # m (B, T, d) -> (W_fb_k m, W_fb_v m) of reading layer j: (B, T, 2, Hkv, hd)
        return self.w_fb[0 if self.shared else j](m).view(*m.shape[:2], 2, self.Hkv, self.hd)

    def residual(self, j, x, m):
        return self.alpha[j] * x + self.gamma[j] * m

    def gated_kv(self, j, a, qkv, m, mem_kv):
        # qkv: (B, T, H + 2 Hkv, hd), the last 2 Hkv heads k and v; mem_kv: LRT-shared's W_fb m, once for all layers
        B, T, Hkv = a.size(0), a.size(1), self.Hkv
        g = 2 * torch.sigmoid(self.gate[j](a)).view(B, T, 2, Hkv, 1)  # (g_loc, g_fb)
        mem_kv = mem_kv if self.shared else self.project(j, m)
        kv = qkv[:, :, -2 * Hkv:].unflatten(2, (2, Hkv))  # k and v, gated together by the same gates
        return torch.cat([qkv[:, :, :-2 * Hkv], (g[:, :, :1] * kv + g[:, :, 1:] * mem_kv).flatten(2, 3)], 2)

class StateIn:
    """What a run of blocks reads from the recurrence, built once a pass: state (B, T, d), the R_{t-1}
    (T2MLR) or m_{t-1} (LRT) of each token. Block i calls enter(i, x), its attention gated_kv(i, a, qkv)."""

    def __init__(self, model, state):
        self.s, self.fusion, self.lrt, self.state = model.s, model.fusion, model.lrt, state
        self.mem_kv = self.lrt.project(0, state) if self.lrt is not None and self.lrt.shared else None

    def enter(self, i, x):
        if i == self.s and self.fusion is not None:
            return self.fusion(x, self.state)  # T2MLR: x <- Phi(x, R) at block s
        if i >= self.s and self.lrt is not None:
            return self.lrt.residual(i - self.s, x, self.state)  # LRT: x <- alpha x + gamma m
        return x

    def gated_kv(self, i, a, qkv):
        return qkv if i < self.s or self.lrt is None else self.lrt.gated_kv(i - self.s, a, qkv, self.state, self.mem_kv)

# -----------------------------------------------------------------------------
# the model

class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        config.validate()
        self.config = c = config
        self.rec = c.recurrence
        # the segments; with no recurrence everything is "below" (s = e + 1 = L)
        self.s, self.e = (c.rec_start, c.rec_end) if self.rec != 'none' else (c.n_layer, c.n_layer - 1)
        self.wte = nn.Embedding(c.padded_vocab, c.n_embd)
        self.h = nn.ModuleList([Block(c, i) for i in range(c.n_layer)])
        self.ln_f = RMSNorm(c.n_embd, c.norm_eps)
        self.lm_head = nn.Linear(c.n_embd, c.padded_vocab, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.fusion = T2MLRFusion(c) if self.rec == 't2mlr' else None
        self.lrt = LRT(c, self.s) if self.rec == 'lrt' else None
        cos, sin = rope_tables(c.n_embd // c.n_head, c.block_size, c.rope_theta)
        self.register_buffer('rope_cos', cos, persistent=False)
        self.register_buffer('rope_sin', sin, persistent=False)
        self._init_weights()

    def _init_weights(self):
        for name, p in self.named_parameters():
            if name.endswith(('w_down.weight', 'attn.wo.weight')):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.config.n_layer))  # GPT-2's residual scaling
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        if self.fusion is not None:
            self.fusion.init_weights(self.config.rec_gate_init, self.config.rec_gate_gain)
        if self.lrt is not None:
            self.lrt.init_weights()

    is_rec_param = staticmethod(lambda name: name.startswith(('fusion.', 'lrt.')))  # the recurrence's own

    def run_blocks(self, x, a, b, pos, state_in=None, cache=None):
        """The primitive: blocks a..b for x (B, T, d), the tokens at positions pos (a range: 0..T-1, one
        token, or a strided subset), each reading state_in (None: the plain model), over the KVCache
        cache (None: the tokens among themselves)."""
        if a > b:
            return x
        rope, mask = self.rope_and_mask(pos, cache)
        for i in range(a, b + 1):
            x = self.h[i](x, rope, pos, mask, cache, state_in)
        return x

    def state_input(self, state):
        return StateIn(self, state)

    def next_state(self, h, state):
        """The state a token hands on, from h = h^(e)_t and the state it read (B, T, d); None: it ran plain."""
        if self.rec == 'lrt':
            return F.rms_norm(h, (h.size(-1),), eps=self.config.norm_eps)  # m_t = rmsnorm(h^(e)_t), no weight
        if state is None:
            return h  # T2MLR: a plain token hands on its raw h^(e)_t (the official code's first guess)
        m = h + state  # m_t = h^(e)_t + R_{t-1};  R_t = m_t * clamp(1 / rms(m_t), 1/5, 5), the scale a constant
        return m * torch.rsqrt(m.detach().pow(2).mean(-1, keepdim=True) + 1e-6).clamp(0.2, 5.0)

    def shift_states(self, states, idx):  # the states tokens 0..T-1 hand on -> the ones they read: [0, X_0, .., X_{T-2}]
        return self.reset(F.pad(states[:, :-1], (0, 0, 1, 0)), idx)

    def reset(self, state, idx):  # a document's first token (reset_token) reads 0
        if self.config.reset_token is None:
            return state
        return state * (idx != self.config.reset_token).unsqueeze(-1).to(state.dtype)

    def below(self, idx, cache=None):  # blocks 0..s-1: once, in parallel
        return self.run_blocks(self.wte(idx), 0, self.s - 1, range(idx.size(1)), None, cache)

    def span(self, x, state_in, cache=None):  # blocks s..e over the whole sequence
        return self.run_blocks(x, self.s, self.e, range(x.size(1)), state_in, cache)

    def above(self, h, state_in, cache, targets):  # blocks e+1..L-1 and the head -> (logits, loss)
        return self.head(self.run_blocks(h, self.e + 1, self.config.n_layer - 1, range(h.size(1)), state_in, cache), targets)

    def head(self, x, targets):  # the padded vocabulary rows: never sampled, never in the loss
        logits = self.lm_head(self.ln_f(x))[..., :self.config.vocab_size]
        return logits, (None if targets is None else ce_loss(logits, targets))

    # ------------------------------------------------------------------
    # the forward modes; each scheme returns (logits (B, T, V), loss, the states handed on (B, T, d))

    def forward(self, idx, targets=None, mode='exact', n_iter=8, n_grad=4, n_subsets=2):
        """idx, targets: (B, T) token ids (target -1: no loss) -> (logits (B, T, V), loss). mode: 'exact'
        (what generation computes), 'jacobi' (D = n_iter, B = n_grad), 'interleaved' (S = n_subsets),
        'zero' (every token reads a zero state) or 'plain' (the backbone alone)."""
        T = idx.size(1)
        check_scheme(self.config, mode, n_iter, n_grad, n_subsets, T)
        if self.rec == 'none' or mode == 'plain':
            return self.head(self.run_blocks(self.wte(idx), 0, self.config.n_layer - 1, range(T)), targets)
        if mode == 'zero':
            x = self.below(idx)
            state_in = self.state_input(torch.zeros_like(x))
            return self.above(self.span(x, state_in), state_in, None, targets)
        if mode == 'exact':
            return self.exact(idx, targets)[:2]
        if mode == 'jacobi':
            return self.jacobi(idx, targets, n_iter, n_grad)[:2]
        return self.interleaved(idx, targets, n_subsets)[:2]

    def span_step(self, x, idx, pos, state, cache):
        """One token through the span: x (B, 1, d) its input to block s, state (B, 1, d) what token t-1
        handed on -> (h^(e), the state read, the state handed on)."""
        read = self.reset(state, idx)
        h = self.run_blocks(x, self.s, self.e, pos, self.state_input(read), cache)
        return h, read, self.next_state(h, read)

    def exact(self, idx, targets=None, cache=None, step=None):
        """The exact recurrence (DESIGN.md 5): below the span in parallel; token by token through the
        span, token t reading the state token t-1 handed on (R_{-1} = 0); above in parallel.
        step: engine.py's compiled span_step."""
        (B, T), step = idx.shape, step or self.span_step
        cache = KVCache(self.config.n_layer, T) if cache is None else cache
        x = self.below(idx, cache)
        state, outs = x.new_zeros(B, 1, self.config.n_embd), []
        for t in range(T):
            outs.append(step(x[:, t:t + 1], idx[:, t:t + 1], range(t, t + 1), state, cache))
            state = outs[-1][2]
        h, read, states = (torch.cat(z, 1) for z in zip(*outs))  # each (B, T, d)
        return *self.above(h, self.state_input(read), cache, targets), states

    def jacobi(self, idx, targets, n_iter, n_grad):
        """Jacobi fixed-point iterations over the span (DESIGN.md 6), D = n_iter, B = n_grad: a first guess
        of the states read, D-1 iterations, the last B with gradient, a final pass with the layers above.
        Exact at positions 0..D-1 ('plain' guess) or everywhere ('exact' guess: the exact loop, no gradient)."""
        D, grad = n_iter, torch.is_grad_enabled()
        x = self.below(idx)
        if self.config.jacobi_init == 'exact':  # then only the iterations with gradient: the rest change nothing
            with torch.inference_mode():
                state = self.shift_states(self.exact(idx)[2], idx)
            state = state.clone()  # a normal tensor, for autograd
            first = max(0, D - 1 - (n_grad if grad else 0))
        else:  # 'plain': the span without the state, each token handing on its raw h^(e)
            with torch.set_grad_enabled(grad and n_grad >= D):
                state = self.shift_states(self.next_state(self.span(x, None), None), idx)
            first = 0
        for d in range(first, D - 1):  # iteration d has D-1-d after it: with gradient when that is <= B
            with torch.set_grad_enabled(grad and D - 1 - d <= n_grad):
                state = self.shift_states(self.next_state(self.span(x, self.state_input(state)), state), idx)
        state_in = self.state_input(state)
        h = self.span(x, state_in)
        return *self.above(h, state_in, None, targets), self.next_state(h, state)

    def interleaved(self, idx, targets, n_subsets):
        """Interleaved subset refinement (DESIGN.md 7), S = n_subsets, subset i = the positions t % S == i:
        a pass with zero memory fills a key/value buffer, then the subsets in order, each reading the states
        refined before it and writing its keys and values into the buffer. Exact at positions 0..S-1 (S = T:
        everywhere). Logits: each position's last pass; loss: the mean of the S + 1 passes."""
        (B, T), S, L = idx.shape, n_subsets, self.config.n_layer
        x, buf = self.below(idx), KVCache(L, T)
        zero = self.state_input(torch.zeros_like(x))
        h = self.run_blocks(x, self.s, self.e, range(T), zero, buf)
        states = self.next_state(h, zero.state)  # (B, T, d) the latest state each token hands on
        logits, loss = self.head(self.run_blocks(h, self.e + 1, L - 1, range(T), zero, buf), targets)
        logits, losses = torch.empty_like(logits), [loss]
        for i in range(S):
            P, st = range(i, T, S), self.shift_states(states, idx)[:, i::S]  # the memory at subset i
            state_in = self.state_input(st)
            h = self.run_blocks(x[:, i::S], self.s, self.e, P, state_in, buf)
            states = states.slice_scatter(self.next_state(h, st), dim=1, start=i, end=T, step=S)
            out = self.run_blocks(h, self.e + 1, L - 1, P, state_in, buf)
            logits[:, i::S], loss = self.head(out, None if targets is None else targets[:, i::S])
            losses.append(loss)
        return logits, None if targets is None else sum(losses) / len(losses), states

    # ------------------------------------------------------------------
    # generation: the KV cache and one state vector per sequence, one forward pass per token

    @torch.no_grad()
    def prefill(self, idx, cache, mode='exact', n_iter=8):
        """A prompt (B, T) into the cache by the exact recurrence -> (logits (B, T, V), the state the next
        token reads (B, d), span passes). (mode, n_iter: lab/model_full.py's Jacobi and plain prefills.)"""
        if mode != 'exact':
            raise ValueError(f"unknown prefill mode {mode!r}: this model prefills 'exact' (lab/model_full.py: 'jacobi', 'plain')")
        if self.rec == 'none':
            return self.head(self.run_blocks(self.wte(idx), 0, self.config.n_layer - 1, range(idx.size(1)), None, cache), None)[0], None, 0
        logits, _, states = self.exact(idx, None, cache)
        return logits, states[:, -1].contiguous(), idx.size(1)  # (B, d) laid out as decode_step's

    @torch.no_grad()
    def decode_step(self, tok, pos, state, cache):
        """One forward pass for one new token a row: tok (B, 1) at position t, pos = range(t, t + 1) (or
        engine.py's (1,) tensor), state (B, d) from token t-1 -> (logits (B, 1, V), the new state (B, d))."""
        x = self.wte(tok)
        if self.rec == 'none':
            return self.head(self.run_blocks(x, 0, self.config.n_layer - 1, pos, None, cache), None)[0], None
        read = self.reset(state[:, None], tok)
        state_in = self.state_input(read)  # once a token, for every layer
        h = self.run_blocks(x, 0, self.e, pos, state_in, cache)
        x = self.run_blocks(h, self.e + 1, self.config.n_layer - 1, pos, state_in, cache)
        return self.head(x, None)[0], self.next_state(h, read)[:, 0]

    def new_cache(self, B, max_len):
        return KVCache(self.config.n_layer, max_len)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prefill='exact', prefill_iters=8,
                 return_logits=False, generator=None, stop_token=None, on_token=None, runner=None, **prefill_kw):
        """idx: (B, T0) prompts -> (B, T0 + max_new_tokens) tokens (return_logits: and each next token's
        logits): a prefill, then one forward pass per new token. temperature 0 = greedy; on_token(tokens)
        after each; stop_token: stop once every row made it. runner: whose new_cache, prefill and
        decode_step run (engine.Engine: compiled), default this model's; prefill_kw: lab/model_full.py's."""
        check_generate(self.config, idx, max_new_tokens, temperature, top_k)
        run, (B, T0) = runner or self, idx.shape
        cache = run.new_cache(B, T0 + max_new_tokens)
        logits, state, _ = run.prefill(idx, cache, prefill, prefill_iters, **prefill_kw)
        all_logits, out, done = [logits], [idx], torch.zeros(B, 1, dtype=torch.bool, device=idx.device)
        for step in range(max_new_tokens):
            out.append(sample(logits[:, -1], temperature, top_k, generator))  # (B, 1)
            if on_token is not None:
                on_token(torch.cat(out, 1))
            done |= out[-1] == (-1 if stop_token is None else stop_token)
            if done.all():
                break
            if step < max_new_tokens - 1:
                logits, state = run.decode_step(out[-1], range(T0 + step, T0 + step + 1), state, cache)
                all_logits.append(logits)
        return (torch.cat(out, 1), torch.cat(all_logits, 1)) if return_logits else torch.cat(out, 1)

    def param_groups(self, weight_decay, gate_lr_mult=1.0):
        """AdamW groups: decay on matrices only; T2MLR's scalar gates g_cur, g_rec at lr * gate_lr_mult
        (Adam moves a small scalar by a large fraction a step: docs/recipe.md). train.py sets lr * lr_mult."""
        groups = {}
        for p in self.parameters():
            mult, wd = gate_lr_mult if p.dim() == 0 else 1.0, 0.0 if p.dim() < 2 else weight_decay
            groups.setdefault((p.dim(), wd, mult), dict(params=[], weight_decay=wd, lr_mult=mult))['params'].append(p)
        return list(groups.values())

    def rope_and_mask(self, pos, cache):
        """The RoPE rows of the tokens at pos and the attention mask: None where attention is causal among
        them (or one query sees the whole prefix), else causal_mask (T, keys). pos a (1,) tensor
        (engine.py's compiled step): the mask covers the cache's whole buffer, no shape depends on it."""
        W, cos, sin = self.config.attn_window, self.rope_cos, self.rope_sin
        if torch.is_tensor(pos):
            rope = (cos.index_select(0, pos)[:, None], sin.index_select(0, pos)[:, None])
            return rope, causal_mask(pos, torch.arange(cache.max_len, device=pos.device), W)
        rope = (cos[pos.start:pos.stop:pos.step, None], sin[pos.start:pos.stop:pos.step, None])
        strided = cache is not None and len(pos) > 1 and not (pos.start == 0 and pos.step == 1)
        if (W == 0 or pos[-1] < W) and not strided:  # the window cuts no key before position W
            return rope, None
        qpos = torch.arange(pos.start, pos.stop, pos.step, device=cos.device)
        return rope, causal_mask(qpos, torch.arange(pos[-1] + 1, device=cos.device), W)

# -----------------------------------------------------------------------------
# the KV cache: the one mechanism behind decoding, the exact loop and the interleaved buffer

class KVCache:
    """Per-layer keys (after RoPE) and values, (B, n_kv_head, max_len, head_dim), by position. write(i,
    pos, k, v), pos a range -> the prefix 0..pos[-1]; under autograd out of place, so that the gradient
    flows through the buffer (engine.py's StaticKVCache adds an in-place one-token write)."""

    def __init__(self, n_layer, max_len):
        self.max_len, self.k, self.v = max_len, [None] * n_layer, [None] * n_layer

    def _full(self, i, k, v):  # the buffers at full length: allocate, or pad a graph-kept prefix
        if self.k[i] is None or self.k[i].dtype != k.dtype or self.k[i].size(0) != k.size(0):
            shape = (k.size(0), k.size(1), self.max_len, k.size(3))
            self.k[i], self.v[i] = k.new_zeros(shape), v.new_zeros(shape)
        elif self.k[i].size(2) < self.max_len:
            self.k[i], self.v[i] = (F.pad(t, (0, 0, 0, self.max_len - t.size(2))) for t in (self.k[i], self.v[i]))

    def write(self, i, pos, k, v):  # k, v: (B, Hkv, len(pos), hd)
        if pos[-1] + 1 > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions, position {pos[-1]} asked for")
        if self.k[i] is None and pos.start == 0 and pos.step == 1 and torch.is_grad_enabled():
            self.k[i], self.v[i] = k, v  # a training forward's first pass: keep its graph
            return k, v
        self._full(i, k, v)
        if torch.is_grad_enabled():  # out of place: autograd keeps every version
            sl = dict(dim=2, start=pos.start, end=pos.stop, step=pos.step)
            self.k[i], self.v[i] = self.k[i].slice_scatter(k, **sl), self.v[i].slice_scatter(v, **sl)
        else:
            self.k[i][:, :, pos.start:pos.stop:pos.step], self.v[i][:, :, pos.start:pos.stop:pos.step] = k, v
        return self.k[i][:, :, :pos[-1] + 1], self.v[i][:, :, :pos[-1] + 1]

# -----------------------------------------------------------------------------
# helpers: the mask, the loss, sampling, the checks of a forward's and generation's inputs

def causal_mask(qpos, kpos, window=0):
    """(Tq, Tk) bool: a query at position q reads a key at p iff p <= q (and p > q - window, window > 0)."""
    return (kpos[None, :] <= qpos[:, None]) & ((kpos[None, :] > qpos[:, None] - window) if window > 0 else True)

def ce_loss(logits, targets):
    """Mean cross-entropy over the positions with target != -1 (0 if there are none)."""
    logits, targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction='sum') / (targets != -1).sum().clamp(min=1)

def sample(logits, temperature=1.0, top_k=None, generator=None):
    """logits: (B, V) -> (B, 1) token ids. temperature 0 = greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float('inf')
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)

def check_scheme(config, mode, n_iter, n_grad, n_subsets, T):
    for ok, msg in [(T <= config.block_size, f"sequence length {T} exceeds block_size {config.block_size}"),
                    (mode in ('plain', 'exact', 'jacobi', 'interleaved', 'zero'),
                     f"unknown mode {mode!r}; expected 'plain', 'exact', 'jacobi', 'interleaved' or 'zero'"),
                    (1 <= n_iter, f"n_iter={n_iter}: Jacobi needs at least one iteration (n_iter >= 1)"),
                    (0 <= n_grad <= n_iter, f"n_grad={n_grad}: the Jacobi iterations with gradient must be 0..n_iter={n_iter}"),
                    (1 <= n_subsets and not (mode == 'interleaved' and n_subsets > T),
                     f"n_subsets={n_subsets}: interleaved needs 1 <= n_subsets <= the sequence length {T}")]:
        if not ok:
            raise ValueError(msg)

def check_generate(config, idx, max_new_tokens, temperature, top_k):
    for ok, msg in [(idx.dim() == 2 and idx.numel() > 0 and not (idx.is_floating_point() or idx.dtype == torch.bool),
                     f"the prompts must be (B, T) integer token ids, B, T >= 1; got {tuple(idx.shape)} {idx.dtype}"),
                    (idx.numel() == 0 or 0 <= int(idx.min()) <= int(idx.max()) < config.vocab_size,
                     f"the prompts hold ids outside the vocabulary 0..{config.vocab_size - 1}"),
                    (isinstance(max_new_tokens, int) and 0 <= max_new_tokens <= config.block_size - idx.size(-1),
                     f"max_new_tokens={max_new_tokens!r}: the prompt and new tokens must fit block_size {config.block_size}"),
                    (temperature >= 0, f"temperature={temperature} must be >= 0 (0 = greedy)"),
                    (top_k is None or type(top_k) is int and top_k >= 1, f"top_k={top_k!r} must be None or an int >= 1")]:
        if not ok:
            raise ValueError(msg)
