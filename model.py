"""
One GPT with latent token-to-token recurrence, in one file.

The backbone is a Llama-style decoder (RMSNorm, RoPE, grouped-query attention,
SwiGLU, no biases). On top of it, a constant-size recurrent state carries the
hidden state of token t-1 at a *source* layer (rec_end) into an earlier layer of
token t. Two fusion styles (see docs/DESIGN.md sections 3 and 4):

  't2mlr'  T2MLR (Cai et al. 2026): a gated fusion Phi(h, R) at the input of
           block rec_start; state R_t read at the output of block rec_end.
  'lrt'    Latent Recurrent Transformer (Huang et al. 2026): memory
           m_t = rmsnorm(h^(rec_end)_t) injected into every block >= rec_start,
           into the residual stream and into each token's own key/value.

Vocabulary used in comments: layers are 0-based, h^(l)_t is the residual stream
at the OUTPUT of block l for token t. The layers split into three segments:

  below  = blocks 0 .. s-1        never read the state: always run in parallel
  span   = blocks s .. e          read the state and produce the next one
  above  = blocks e+1 .. L-1      read the state (LRT) or not (T2MLR), but never
                                  feed it: run in parallel once states are known

Every way of running the model (exact sequential forward, Jacobi, interleaved
subsets, prefill, one-token decode) is built from one primitive:
run_blocks(x, a, b, pos, state_in, cache) = "run blocks a..b at positions pos,
with this incoming state, writing into / attending over these cached keys".
"""

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# config

@dataclass
class GPTConfig:
    block_size: int = 1024      # max sequence length (RoPE table size; caps prompt + generated tokens)
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int = 12         # < n_head: grouped-query attention
    n_embd: int = 768
    mlp_hidden: int = 0         # SwiGLU hidden width; 0 = 8/3 * n_embd rounded up to 64
    rope_theta: float = 10000.0
    rope: bool = True           # False: no positional encoding at all (NoPE; the official S5-Retrieval recipe)
    norm_eps: float = 1e-5
    dropout: float = 0.0
    tie_embeddings: bool = True
    attn_window: int = 0        # > 0: each token attends to the last attn_window tokens only (itself included)
    # --- recurrence
    recurrence: str = 'none'    # 'none' | 't2mlr' | 'lrt'
    rec_start: int = 0          # s: first block that reads the state
    rec_end: int = -1           # e: block whose output is the source of the state; -1 = last
    reset_token: Optional[int] = None  # token id that starts a document: state reset to 0 there
    # T2MLR options (DESIGN.md section 3)
    rec_residual: bool = True   # m_t = h^(e)_t + R_{t-1} (else m_t = h^(e)_t)
    rec_proj: bool = True       # r = W_rec R (else r = R)
    rec_gate_gain: float = 1.0  # xavier gain of f_cur/f_rec (1e-2 for fine-tuning)
    rec_residual_detach: bool = False  # m_t = h^(e)_t + sg(R_{t-1}): no gradient through the residual (official option)
    # Jacobi (DESIGN.md 6): what the first span pass reads. 'plain': no fusion, and each
    # token hands on its raw h^(e) (the official code); 'zero': the zero state, fused
    jacobi_init: str = 'plain'
    # LRT options (DESIGN.md section 4)
    lrt_inject: str = 'both'    # 'kv' | 'residual' | 'both'
    lrt_shared: bool = True     # one W_fb_k/W_fb_v pair for all layers (else one per layer)
    lrt_identity_init: bool = False  # gamma=0, W_fb=0: starts equal to the plain GPT
    lrt_gate_channels: int = 0  # the gates read the first this-many channels of the normed input; 0 = all (DESIGN.md 11)

    def __post_init__(self):
        if self.mlp_hidden == 0:
            self.mlp_hidden = 64 * math.ceil(8 * self.n_embd / 3 / 64)
        if self.rec_end == -1:
            self.rec_end = self.n_layer - 1
        self.validate()

    def validate(self):
        def bad(msg):
            raise ValueError(f"GPTConfig: {msg}")
        for k in ('block_size', 'vocab_size', 'n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mlp_hidden'):
            if getattr(self, k) < 1:
                bad(f"{k}={getattr(self, k)} must be >= 1")
        if self.n_embd % self.n_head:
            bad(f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}")
        if self.n_head % self.n_kv_head:
            bad(f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}")
        if (self.n_embd // self.n_head) % 2:
            bad(f"head dim {self.n_embd // self.n_head} must be even for RoPE")
        if not 0 <= self.lrt_gate_channels <= self.n_embd:
            bad(f"lrt_gate_channels={self.lrt_gate_channels} must be in 0..n_embd={self.n_embd} (0 = all channels)")
        if self.attn_window < 0:
            bad(f"attn_window={self.attn_window} must be >= 0 (0 = full causal attention)")
        if not 0.0 <= self.dropout < 1.0:
            bad(f"dropout={self.dropout} must be in [0, 1)")
        if self.recurrence not in ('none', 't2mlr', 'lrt'):
            bad(f"unknown recurrence {self.recurrence!r}; expected 'none', 't2mlr' or 'lrt'")
        if self.jacobi_init not in ('plain', 'zero'):
            bad(f"unknown jacobi_init {self.jacobi_init!r}; expected 'plain' (the official code) or 'zero'")
        if self.lrt_inject not in ('kv', 'residual', 'both'):
            bad(f"unknown lrt_inject {self.lrt_inject!r}; expected 'kv', 'residual' or 'both'")
        if self.recurrence != 'none':
            L, s, e = self.n_layer, self.rec_start, self.rec_end
            if not 0 <= s < L:
                bad(f"rec_start={s} is out of range for n_layer={L} (layers are 0..{L-1})")
            if not 0 <= e < L:
                bad(f"rec_end={e} is out of range for n_layer={L} (layers are 0..{L-1}, or -1 for the last)")
            if e < s:
                bad(f"rec_end={e} < rec_start={s}: the state must be read at or above the layer that receives it")
        if self.reset_token is not None and not 0 <= self.reset_token < self.vocab_size:
            bad(f"reset_token={self.reset_token} is not a token id (vocab_size={self.vocab_size})")


def smollm2_135m_config(**overrides):
    """The shape of SmolLM2-135M (the T2MLR paper's backbone)."""
    args = dict(block_size=2048, vocab_size=49152, n_layer=30, n_head=9, n_kv_head=3,
                n_embd=576, mlp_hidden=1536, rope_theta=100000.0, norm_eps=1e-5, tie_embeddings=True)
    args.update(overrides)
    return GPTConfig(**args)

# -----------------------------------------------------------------------------
# KV cache: the one mechanism behind decoding AND the interleaved training buffer

class KVCache:
    """Per-layer keys/values (after RoPE), shape (B, n_kv_head, max_len, head_dim),
    indexed by original token position. Allocated lazily, in the dtype of the keys.
    Two ways to write, one buffer:
      pos a python range  (prefill, training): written at pos, read as the prefix [0, pos[-1]];
      pos a long tensor   (the static step: decode, exact span): written in place with
                          index_copy_, read as the WHOLE buffer, so shapes never change and
                          torch.compile compiles the step once (run_blocks masks the rest)."""

    def __init__(self, n_layer, max_len):
        self.max_len = max_len
        self.k = [None] * n_layer
        self.v = [None] * n_layer

    def _full(self, i, k, v):
        # the buffers at full length: allocate, or pad a graph-kept prefix (interleaved training)
        if self.k[i] is None:
            shape = (k.size(0), k.size(1), self.max_len, k.size(3))
            self.k[i], self.v[i] = k.new_zeros(shape), v.new_zeros(shape)
        elif self.k[i].size(2) < self.max_len:
            pad = self.max_len - self.k[i].size(2)
            self.k[i] = F.pad(self.k[i], (0, 0, 0, pad))
            self.v[i] = F.pad(self.v[i], (0, 0, 0, pad))

    def write(self, i, pos, k, v):
        # pos: python range or (T,) long tensor of positions, k/v: (B, Hkv, T, hd)
        if torch.is_tensor(pos):
            self._full(i, k, v)
            if torch.is_grad_enabled():  # exact forward under autograd: out-of-place
                self.k[i], self.v[i] = self.k[i].index_copy(2, pos, k), self.v[i].index_copy(2, pos, v)
            else:                        # inference: in place, O(1) memory traffic per token
                self.k[i].index_copy_(2, pos, k)
                self.v[i].index_copy_(2, pos, v)
            return self.k[i], self.v[i]
        kv_len = pos[-1] + 1
        if kv_len > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions, position {pos[-1]} asked for")
        if self.k[i] is None and pos.start == 0 and pos.step == 1 and torch.is_grad_enabled():
            self.k[i], self.v[i] = k, v   # init pass of interleaved training: keep the graph
            return k, v
        self._full(i, k, v)
        if torch.is_grad_enabled():
            # training (interleaved): out-of-place, so autograd keeps every version
            # and gradients flow through the buffer into earlier passes
            sl = dict(dim=2, start=pos.start, end=pos.stop, step=pos.step)
            self.k[i] = self.k[i].slice_scatter(k, **sl)
            self.v[i] = self.v[i].slice_scatter(v, **sl)
        else:
            self.k[i][:, :, pos.start:pos.stop:pos.step] = k
            self.v[i][:, :, pos.start:pos.stop:pos.step] = v
        return self.k[i][:, :, :kv_len], self.v[i][:, :, :kv_len]

# -----------------------------------------------------------------------------
# backbone pieces

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


def rope_tables(head_dim, max_len, theta):
    # Llama convention: frequencies duplicated over the two halves of the head
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)  # (max_len, hd)
    dtype = torch.get_default_dtype()  # float64 tables when a test builds the model in float64
    # rotate_half(x) = [-x2, x1] = roll(x, hd/2) * [-1, +1]: the sign goes into the sin table
    sign = torch.cat([-torch.ones(head_dim // 2), torch.ones(head_dim // 2)]).to(torch.float64)
    return emb.cos().to(dtype), (emb.sin() * sign).to(dtype)


def apply_rope(x, cos, sin):
    # x: (B, T, H, hd); cos/sin: (T, 1, hd), sin signed (rope_tables). rotate_half pairs
    # dim j with dim j + hd/2: x cos + rotate_half(x) sin, in 4 ops
    return x * cos.to(x.dtype) + x.roll(x.size(-1) // 2, -1) * sin.to(x.dtype)


class Attention(nn.Module):
    recorder = None  # a dict while GPT.recording() is on (see record())

    def __init__(self, config, reads_memory):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.hd = config.n_embd // config.n_head
        d, dkv = config.n_embd, self.n_kv_head * self.hd
        # W_q, W_k, W_v stacked in one matrix (d + 2 dkv, d): one matmul for all three
        self.wqkv = nn.Linear(d, d + 2 * dkv, bias=False)
        self.wo = nn.Linear(d, d, bias=False)
        self.dropout = config.dropout
        # LRT gated KV projection: (g_loc, g_fb) = 2 sigmoid(W_g a), one pair per KV head
        # (the official code can read only the first lrt_gate_channels channels of a)
        self.gate_in = config.lrt_gate_channels or d
        self.lrt_gate = nn.Linear(self.gate_in, 2 * self.n_kv_head, bias=False) if reads_memory else None

    def forward(self, a, rope, pos, mask, cache, layer, mem_kv=None, rec_on=None):
        # a: (B, T, d) normed block input at positions pos (a python range)
        B, T, _ = a.shape
        H, Hkv = self.n_head, self.n_kv_head
        qkv = self.wqkv(a).view(B, T, H + 2 * Hkv, self.hd)  # heads: H of q, Hkv of k, Hkv of v
        if mem_kv is not None:
            # LRT (DESIGN.md 4): k_t = g_loc * W_k a + g_fb * W_fb_k m_{t-1}, same for v.
            # A gated addition to the token's OWN key/value: the cache keeps its shape.
            # g: (B, T, 2, Hkv, 1) = (g_loc, g_fb); mem_kv: (B, T, 2, Hkv, hd) = (W_fb_k m, W_fb_v m)
            g = 2 * torch.sigmoid(self.lrt_gate(a[..., :self.gate_in])).view(B, T, 2, Hkv, 1)
            if self.recorder is not None:
                record(self.recorder, f'g.{layer}', pos, g[..., 0])  # (B, T, 2, Hkv): g_loc, g_fb
            kv = qkv[:, :, H:].unflatten(2, (2, Hkv))  # k and v gated together, same gates
            kv = where_on(rec_on, g[:, :, :1] * kv + g[:, :, 1:] * mem_kv, kv)
            qkv = torch.cat([qkv[:, :, :H], kv.flatten(2, 3)], 2)
        # RoPE on q and k together: the first H + Hkv heads
        q, k = apply_rope(qkv[:, :, :H + Hkv], *rope).split([H, Hkv], 2)
        v = qkv[:, :, H + Hkv:]
        if torch.is_grad_enabled():
            v = v.contiguous()  # else backward keeps the whole qkv storage alive through this view
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, hd)
        if cache is not None:
            k, v = cache.write(layer, pos, k, v)  # now (B, Hkv, kv_len, hd)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
            dropout_p=self.dropout if self.training else 0.0, enable_gqa=True)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        # W_gate and W_up stacked in one matrix (2 mlp_hidden, d): one matmul for both
        self.w_gu = nn.Linear(config.n_embd, 2 * config.mlp_hidden, bias=False)
        self.w_down = nn.Linear(config.mlp_hidden, config.n_embd, bias=False)

    def forward(self, x):
        gate, up = self.w_gu(x).chunk(2, dim=-1)
        return self.w_down(F.silu(gate) * up)


class Block(nn.Module):
    recorder = None  # a dict while GPT.recording() is on (see record())

    def __init__(self, config, reads_memory=False):
        super().__init__()
        self.ln_1 = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = Attention(config, reads_memory and config.lrt_inject != 'residual')
        self.ln_2 = RMSNorm(config.n_embd, config.norm_eps)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)
        # LRT residual injection x <- alpha x + gamma m_{t-1} (DESIGN.md 4)
        self.lrt_alpha = self.lrt_gamma = None
        if reads_memory and config.lrt_inject != 'kv':
            self.lrt_alpha = nn.Parameter(torch.ones(()))
            self.lrt_gamma = nn.Parameter(torch.full((), 0.0 if config.lrt_identity_init else 0.1))

    def forward(self, x, rope, pos, mask, cache, layer, mem=None, mem_kv=None, rec_on=None):
        if mem is not None and self.lrt_alpha is not None:
            if self.recorder is not None:  # the two terms of the sum, as norms over channels: (B, T)
                record(self.recorder, f'gamma_m.{layer}', pos, (self.lrt_gamma * mem).norm(dim=-1))
                record(self.recorder, f'alpha_x.{layer}', pos, (self.lrt_alpha * x).norm(dim=-1))
            x = where_on(rec_on, self.lrt_alpha * x + self.lrt_gamma * mem, x)
        y = self.attn(self.ln_1(x), rope, pos, mask, cache, layer, mem_kv, rec_on)
        x = x + (self.drop(y) if self.drop.p > 0 else y)  # no dropout call at p = 0
        y = self.mlp(self.ln_2(x))
        return x + (self.drop(y) if self.drop.p > 0 else y)

# -----------------------------------------------------------------------------
# T2MLR gated fusion (DESIGN.md section 3)

class T2MLRFusion(nn.Module):
    """Phi(h, R) = h + tanh(g_cur) sigmoid(f_cur([h, r])) * h + tanh(g_rec) sigmoid(f_rec([h, r])) * r,
    r = W_rec R. g_cur = g_rec = 0 at init, so Phi is the identity: the model starts as the plain GPT."""
    recorder = None  # a dict while GPT.recording() is on (see record())

    def __init__(self, config):
        super().__init__()
        d = config.n_embd
        self.w_rec = nn.Linear(d, d, bias=False) if config.rec_proj else None
        self.f_cur = nn.Linear(2 * d, d, bias=True)
        self.f_rec = nn.Linear(2 * d, d, bias=True)
        # scalar gates, fp32 (train.py's bf16 is autocast, which leaves them fp32; .double() makes them fp64)
        self.g_cur = nn.Parameter(torch.zeros((), dtype=torch.float32))
        self.g_rec = nn.Parameter(torch.zeros((), dtype=torch.float32))

    def forward(self, h, R, pos=None):
        # h: (B, T, d) input of block rec_start; R: (B, T, d) incoming state R_{t-1}; pos: their positions
        r = self.w_rec(R) if self.w_rec is not None else R
        hr = torch.cat([h, r], dim=-1)
        # tanh in at least fp32, then cast to the activations' dtype
        wide = torch.promote_types(torch.float32, h.dtype)
        g_cur, g_rec = (torch.tanh(g.to(wide)).to(h.dtype) for g in (self.g_cur, self.g_rec))
        cur = g_cur * torch.sigmoid(self.f_cur(hr))  # (B, T, d) the gates tanh(g) sigmoid(f([h, r]))
        rec = g_rec * torch.sigmoid(self.f_rec(hr))
        if self.recorder is not None:
            record(self.recorder, 'gate_cur', pos, cur)
            record(self.recorder, 'gate_rec', pos, rec)
        return h + cur * h + rec * r

# -----------------------------------------------------------------------------
# the model

class GPT(nn.Module):
    recorder = None  # a dict while recording() is on

    def __init__(self, config):
        super().__init__()
        config.validate()
        self.config = c = config
        self.rec = c.recurrence
        # the segments; with no recurrence everything is "below" (s = e + 1 = L)
        self.s, self.e = (c.rec_start, c.rec_end) if self.rec != 'none' else (c.n_layer, c.n_layer - 1)
        self.wte = nn.Embedding(c.vocab_size, c.n_embd)
        self.drop = nn.Dropout(c.dropout)
        reads = lambda i: self.rec == 'lrt' and i >= self.s
        self.h = nn.ModuleList([Block(c, reads(i)) for i in range(c.n_layer)])
        self.ln_f = RMSNorm(c.n_embd, c.norm_eps)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.wte.weight
        self.fusion = T2MLRFusion(c) if self.rec == 't2mlr' else None
        # LRT feedback projections W_fb_k, W_fb_v: one pair (shared) or one per reading layer,
        # stacked in one matrix [W_fb_k; W_fb_v] (2 dkv, d): one matmul for both
        self.lrt_fb = None
        if self.rec == 'lrt' and c.lrt_inject != 'residual':
            n = 1 if c.lrt_shared else c.n_layer - self.s
            dkv = c.n_kv_head * (c.n_embd // c.n_head)
            self.lrt_fb = nn.ModuleList([nn.Linear(c.n_embd, 2 * dkv, bias=False) for _ in range(n)])
        cos, sin = rope_tables(c.n_embd // c.n_head, c.block_size, c.rope_theta)
        if not c.rope:  # NoPE: rotate by angle 0 (cos 1, sin 0), so apply_rope is the identity, exactly
            cos, sin = torch.ones_like(cos), torch.zeros_like(sin)
        self.register_buffer('rope_cos', cos, persistent=False)
        self.register_buffer('rope_sin', sin, persistent=False)
        self._init_weights()

    def _init_weights(self):
        c = self.config
        for name, p in self.named_parameters():
            if name.endswith('w_down.weight') or name.endswith('attn.wo.weight'):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layer))  # GPT-2 residual scaling
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)
        for blk in self.h:
            if blk.attn.lrt_gate is not None:
                nn.init.zeros_(blk.attn.lrt_gate.weight)  # both gates start at 2 sigmoid(0) = 1
        if self.fusion is not None:
            for f in (self.fusion.f_cur, self.fusion.f_rec):
                nn.init.xavier_normal_(f.weight, gain=c.rec_gate_gain)
                nn.init.zeros_(f.bias)  # sigmoid(0) = 0.5: the official S5/GSM8K recipes' gate init
            if self.fusion.w_rec is not None:
                self.fusion.w_rec.reset_parameters()  # PyTorch's default Linear init, as the official code
        if self.lrt_fb is not None and c.lrt_identity_init:
            for lin in self.lrt_fb:
                nn.init.zeros_(lin.weight)

    def get_num_params(self, non_embedding=True):
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and not self.config.tie_embeddings:
            n -= self.lm_head.weight.numel()
        return n

    @staticmethod
    def is_rec_param(name):
        """Parameters the recurrence adds on top of the plain GPT."""
        return name.startswith('fusion.') or 'lrt_' in name

    @contextmanager
    def recording(self):
        """with model.recording() as rec: ... -- every forward pass run inside keeps, in the
        dict rec, the values the recurrence computes (see record(); sample.py's --trace and
        train.py's gate statistics read them with recorded()). Off (recorder None) it costs
        one attribute test per block."""
        rec = {}
        mods = [m for m in self.modules() if hasattr(m, 'recorder')]
        for m in mods:
            m.recorder = rec
        try:
            yield rec
        finally:
            for m in mods:
                del m.recorder  # back to the class attribute None: the modules are as before

    # ------------------------------------------------------------------
    # the primitive: run blocks a..b at positions pos

    def run_blocks(self, x, a, b, pos, state_in=None, cache=None, rec_mask=None, shared_kv=None):
        """x: (B, len(pos), d), the residual stream at the input of block a, for the
        tokens at original positions pos (a python range; or a (T,) long tensor: the
        static step, which needs cache and attends over its whole buffer). state_in: (B, len(pos), d),
        the state each of those tokens reads (R_{t-1} or m_{t-1}); None runs the plain
        model (no fusion, no injection). cache: a KVCache to write keys into and attend
        over (None: the positions are 0..T-1 and attend among themselves).
        rec_mask: optional (B, len(pos)) bool, False where a token runs as the plain
        model even though it has a state (T2MLR's prompt positions in fine-tuning).
        shared_kv: LRT-shared's W_fb projections of state_in (self.shared_kv), when the
        caller runs two segments on the same state and wants them computed once."""
        if a > b:
            return x
        rec_on = None if rec_mask is None else rec_mask.unsqueeze(-1)  # (B, T, 1)
        mask = None  # causal among x itself, or a single query that sees the whole prefix
        W = self.config.attn_window
        if torch.is_tensor(pos):
            # the static step: pos a (T,) tensor, keys = the whole cache buffer, masked by
            # position (no shape depends on pos: torch.compile compiles this once)
            rope = (self.rope_cos.index_select(0, pos)[:, None], self.rope_sin.index_select(0, pos)[:, None])
            kpos, qpos = torch.arange(cache.max_len, device=x.device), pos
        else:
            rope = (self.rope_cos[pos.start:pos.stop:pos.step, None], self.rope_sin[pos.start:pos.stop:pos.step, None])
            if W > 0 or (cache is not None and len(pos) > 1 and not (pos.start == 0 and pos.step == 1)):
                kpos = torch.arange(pos[-1] + 1, device=x.device)
                qpos = torch.arange(pos.start, pos.stop, pos.step, device=x.device)
            else:
                kpos = None
        if kpos is not None:
            # queries at qpos attend to keys 0..qpos causally by original position
            # (and, with a window, only to the last W of them)
            mask = kpos[None, :] <= qpos[:, None]
            if W > 0:
                mask = mask & (kpos[None, :] > qpos[:, None] - W)
        if self.recorder is not None and state_in is not None and a <= self.s <= b:
            record(self.recorder, 'state', pos, state_in)  # (B, T, d) the state read
        for i in range(a, b + 1):
            if state_in is not None and i == self.s and self.fusion is not None:
                x = where_on(rec_on, self.fusion(x, state_in, pos), x)  # T2MLR: fuse at the input of block s
            mem = mem_kv = None
            if state_in is not None and self.rec == 'lrt' and i >= self.s:
                mem = state_in  # LRT: every block >= s reads m_{t-1}
                if self.lrt_fb is not None:
                    if self.config.lrt_shared:  # one projection, computed once for all layers
                        if shared_kv is None:
                            shared_kv = self._fb_kv(0, mem)
                        mem_kv = shared_kv
                    else:
                        mem_kv = self._fb_kv(i - self.s, mem)
            x = self.h[i](x, rope, pos, mask, cache, i, mem, mem_kv, rec_on)
        return x

    def shared_kv(self, state_in):
        """LRT-shared: (W_fb_k m, W_fb_v m) stacked (B, T, 2, Hkv, hd), one projection for
        every layer; else None."""
        if state_in is None or self.lrt_fb is None or not self.config.lrt_shared:
            return None
        return self._fb_kv(0, state_in)

    def _fb_kv(self, j, mem):
        # mem (B, T, d) -> (W_fb_k m, W_fb_v m) stacked: (B, T, 2, Hkv, hd), one matmul
        B, T, _ = mem.shape
        return self.lrt_fb[j](mem).view(B, T, 2, self.config.n_kv_head, self.config.n_embd // self.config.n_head)

    def next_state(self, h, state_in, rec_mask=None):
        """The state token t hands to token t+1, from h = h^(e)_t and the state it read.
        rec_mask: optional (B, T) bool; a T2MLR token that ran as the plain model (False)
        hands on its raw h^(e)_t, unscaled and without the residual (the official code)."""
        if self.rec == 't2mlr':
            # m_t = h^(e)_t + R_{t-1};  R_t = m_t * clamp(1/rms(m_t), 1/5, 5), the scale under detach
            R = state_in
            if R is not None and self.config.rec_residual_detach:
                R = R.detach()  # the official S5 and GSM8K recipes cut the gradient through the residual
            m = h + R if (self.config.rec_residual and R is not None) else h
            scale = torch.rsqrt(m.detach().pow(2).mean(-1, keepdim=True) + 1e-6).clamp(0.2, 5.0)
            return where_on(None if rec_mask is None else rec_mask.unsqueeze(-1), m * scale, h)
        # LRT: m_t = rmsnorm(h^(e)_t), no weight, at every position
        return F.rms_norm(h, (h.size(-1),), eps=self.config.norm_eps)

    def shift_states(self, states, idx, rec_mask=None):
        """states: (B, T, d) produced by tokens 0..T-1 -> (B, T, d) read by tokens 0..T-1:
        shift(X)[:, t] = X[:, t-1], zero at t = 0 and at document starts (reset token)."""
        out = F.pad(states[:, :-1], (0, 0, 1, 0))
        return self._reset(out, idx, rec_mask)

    def _reset(self, state_in, idx, rec_mask=None):
        """Zero the state read at document starts, and where the recurrence is off
        (a plain position reads nothing; what it hands on is next_state's business)."""
        if self.config.reset_token is not None:
            state_in = state_in * (idx != self.config.reset_token).unsqueeze(-1).to(state_in.dtype)
        if rec_mask is not None:
            state_in = state_in * rec_mask.unsqueeze(-1).to(state_in.dtype)
        return state_in

    def _check(self, idx):
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")

    def _logits_loss(self, x, targets):
        logits = self.lm_head(self.ln_f(x))
        return logits, (None if targets is None else ce_loss(logits, targets))

    # ------------------------------------------------------------------
    # forward passes

    def forward(self, idx, targets=None, mode='exact', n_iter=8, n_grad=4, n_subsets=2, rec_mask=None, n_rounds=1):
        """idx, targets: (B, T) token ids (targets -1 = no loss). Returns (logits (B,T,V), loss).
        rec_mask: optional (B, T) bool, where the recurrence is on (default: everywhere).
        mode: 'plain'       the backbone alone, recurrence bypassed
              'exact'       the exact sequential recurrence (what generation computes)
              'jacobi'      Jacobi iterations as the official code: an initial pass, n_iter - 1
                            iterations (gradient through the last n_grad) and a final pass
              'interleaved' n_subsets strided subsets refined one after another, n_rounds times
              'zero'        the exact forward with every position reading an all-zero state
                            (forward_exact's zero_state: how much the model relies on its state)
        With recurrence='none' every mode is the plain parallel forward."""
        self._check(idx)
        if self.rec == 'none' or mode == 'plain':
            x = self.run_blocks(self.drop(self.wte(idx)), 0, self.config.n_layer - 1, range(idx.size(1)))
            return self._logits_loss(x, targets)
        if mode in ('exact', 'zero'):
            return self.forward_exact(idx, targets, rec_mask, zero_state=mode == 'zero')
        if mode == 'jacobi':
            return self.forward_jacobi(idx, targets, n_iter, n_grad, rec_mask)
        if mode == 'interleaved':
            return self.forward_interleaved(idx, targets, n_subsets, rec_mask, n_rounds)
        raise ValueError(f"unknown mode {mode!r}; expected 'plain', 'exact', 'jacobi', 'interleaved' or 'zero'")

    def _exact(self, idx, cache, rec_mask=None, zero_state=False, step=None):
        """Exact recurrence (DESIGN.md 5). Below/above segments run in parallel over the
        sequence; only the span runs token by token. Returns (x_out, last_state).
        zero_state: the state is never handed on, so every token reads R_{-1} = 0."""
        B, T = idx.shape
        L = self.config.n_layer
        x = self.run_blocks(self.drop(self.wte(idx)), 0, self.s - 1, range(T), None, cache)
        state = x.new_zeros(B, 1, self.config.n_embd)  # R_{-1} = 0
        hs, ins = [], []
        for t in range(T):
            # step: the static span step, eager or compiled (generate(compile=...)); the
            # first token runs eagerly, which allocates the span's cache buffers
            f = self._span_step if step is None or t == 0 else step
            h, st, new = f(x, idx, torch.tensor([t], device=idx.device), state, cache, rec_mask)
            if not zero_state:
                state = new
            hs.append(h)
            ins.append(st)
        h, state_in = torch.cat(hs, 1), torch.cat(ins, 1)
        x = self.run_blocks(h, self.e + 1, L - 1, range(T), state_in, cache, rec_mask)
        return x, state[:, 0]

    def _span_step(self, x, idx, pos, state, cache, rec_mask=None):
        """Token pos ((1,) long tensor) of x (B, T, d) through the span, reading state
        (B, 1, d) = what token pos-1 produced. The static step (fixed shapes for every
        pos), like decode_step. Returns (h^(e), the state it read, the state it hands on)."""
        m = None if rec_mask is None else rec_mask.index_select(1, pos)
        st = self._reset(state, idx.index_select(1, pos), m)  # (B, 1, d) what token pos reads
        h = self.run_blocks(x.index_select(1, pos), self.s, self.e, pos, st, cache, m)
        return h, st, self.next_state(h, st, m)

    def forward_exact(self, idx, targets=None, rec_mask=None, zero_state=False):
        """zero_state=True (mode='zero'): every position reads an all-zero state (R_{t-1} = 0,
        m_{t-1} = 0) instead of its predecessor's; everything else is the exact forward, the
        same schedule and arithmetic. The recurrence's modules still run on the zero state:
        T2MLR computes Phi(h, 0) = h + tanh(g_cur) sigmoid(f_cur([h, 0])) h, which is not the
        identity once trained, and LRT keeps x <- alpha x and g_loc * W_k a (g_fb multiplies
        W_fb 0 = 0). So loss(zero) - loss(exact) is what the state carries, not what the
        extra parameters do; at identity init (g_cur = g_rec = 0, or LRT gamma = W_fb = 0)
        the two are bitwise equal."""
        x, _ = self._exact(idx, KVCache(self.config.n_layer, idx.size(1)), rec_mask, zero_state)
        return self._logits_loss(x, targets)

    def _jacobi(self, idx, n_iter, n_grad, cache=None, rec_mask=None):
        """Jacobi fixed-point iterations over the span (DESIGN.md 6), as the official code
        runs them. D = n_iter, B = n_grad:
          initial pass   the span without the state (jacobi_init='plain': no fusion, each
                         token hands on its raw h^(e)) or with the zero state ('zero');
          D-1 iterations fuse the shifted states, run the span, compute new states;
                         only the last B carry gradient;
          final pass     fuses the last states, runs the span and the layers above.
        So the span runs D+1 times and B+1 passes carry gradient (all D+1 when B = D).
        Exact positions after it: 0..D-1 ('plain') or 0..D ('zero'): n_iter >= T is exact.
        Returns (x_out, state_in, h_e) of the final pass."""
        B, T = idx.shape
        D = n_iter
        if D < 1 or not 0 <= n_grad <= D:
            raise ValueError(f"jacobi needs n_iter >= 1 and 0 <= n_grad <= n_iter, got {n_iter}, {n_grad}")
        grad = torch.is_grad_enabled()
        # the layers below the span do not depend on the state: run them once
        x = self.run_blocks(self.drop(self.wte(idx)), 0, self.s - 1, range(T), None, cache)
        # 1. initial pass; it carries gradient only when every pass does (B = D)
        with torch.set_grad_enabled(grad and n_grad >= D):
            if self.config.jacobi_init == 'plain':
                h = self.run_blocks(x, self.s, self.e, range(T), None, cache)
                plain = torch.zeros(B, T, dtype=torch.bool, device=idx.device)
                state_in = self.shift_states(self.next_state(h, None, plain), idx, rec_mask)
            else:
                zero = x.new_zeros(B, T, self.config.n_embd)
                h = self.run_blocks(x, self.s, self.e, range(T), zero, cache, rec_mask, self.shared_kv(zero))
                state_in = self.shift_states(self.next_state(h, zero, rec_mask), idx, rec_mask)
        # 2. D-1 iterations; iteration d has D-1-d left and carries gradient when that is <= B
        for d in range(D - 1):
            with torch.set_grad_enabled(grad and D - 1 - d <= n_grad):
                h = self.run_blocks(x, self.s, self.e, range(T), state_in, cache, rec_mask, self.shared_kv(state_in))
                state_in = self.shift_states(self.next_state(h, state_in, rec_mask), idx, rec_mask)
        # 3. final pass: the span, then the layers above, with the state it read
        kv = self.shared_kv(state_in)
        h = self.run_blocks(x, self.s, self.e, range(T), state_in, cache, rec_mask, kv)
        x = self.run_blocks(h, self.e + 1, self.config.n_layer - 1, range(T), state_in, cache, rec_mask, kv)
        return x, state_in, h

    def forward_jacobi(self, idx, targets=None, n_iter=8, n_grad=4, rec_mask=None):
        x, _, _ = self._jacobi(idx, n_iter, n_grad, None, rec_mask)
        return self._logits_loss(x, targets)

    def forward_interleaved(self, idx, targets=None, n_subsets=2, rec_mask=None, n_rounds=1):
        """Interleaved subset refinement (DESIGN.md 7). Subset i = positions t % S == i.
        n_rounds = R > 1 repeats the S refinements R times, each round reading the states
        the previous one left (our extension for deep chains, DESIGN.md 7; R = 1 is the paper,
        S = 1 with R rounds is the official code's full-sequence multi-refine). Exact
        positions after it: the first max(R*S, R+1); the gradient runs through all of them.
        Returns (logits, loss): logits at each position from the last pass that refined it,
        loss = the mean of the 1 + R*S pass losses (L_0 + sum_r sum_i L_ri) / (R*S + 1)."""
        B, T = idx.shape
        S, L = n_subsets, self.config.n_layer
        if not 1 <= S <= T:
            raise ValueError(f"interleaved needs 1 <= n_subsets <= T={T}, got {S}")
        if n_rounds < 1:
            raise ValueError(f"interleaved needs n_rounds >= 1, got {n_rounds}")
        buf = KVCache(L, T)  # keys/values of blocks s..L-1 (all recomputed per subset), by original position
        xs = self.run_blocks(self.drop(self.wte(idx)), 0, self.s - 1, range(T))  # below: once
        # 1. init pass with zero memory; keep keys/values and the source states
        zero = xs.new_zeros(B, T, self.config.n_embd)
        kv = self.shared_kv(zero)
        h = self.run_blocks(xs, self.s, self.e, range(T), zero, buf, rec_mask, kv)
        states = self.next_state(h, zero, rec_mask)  # (B, T, d) latest state produced by each token
        logits0, loss0 = self._logits_loss(self.run_blocks(h, self.e + 1, L - 1, range(T), zero, buf, rec_mask, kv), targets)
        logits, losses = torch.empty_like(logits0), [loss0]
        # 2. refine the subsets in order, R times over; each sees the states refined before it
        for _ in range(n_rounds):
            for i in range(S):
                P = range(i, T, S)
                m = None if rec_mask is None else rec_mask[:, i::S]
                st = self.shift_states(states, idx, rec_mask)[:, i::S]  # memory shift(h_latest) at P
                kv = self.shared_kv(st)
                h = self.run_blocks(xs[:, i::S], self.s, self.e, P, st, buf, m, kv)
                states = states.slice_scatter(self.next_state(h, st, m), dim=1, start=i, end=T, step=S)
                out = self.run_blocks(h, self.e + 1, L - 1, P, st, buf, m, kv)
                logits_i, loss_i = self._logits_loss(out, None if targets is None else targets[:, i::S])
                logits[:, i::S] = logits_i  # in place: a later round overwrites an earlier one
                losses.append(loss_i)
        # 3. average the R*S + 1 losses
        loss = None if targets is None else sum(losses) / len(losses)
        return logits, loss

    # ------------------------------------------------------------------
    # generation: KV cache + one state vector per sequence, one pass per token

    @torch.no_grad()
    def prefill(self, idx, cache, mode='exact', n_iter=8, compile=False):
        """Process a prompt into the cache. Returns (logits (B,T,V), state (B,d)) where
        state is what the first generated token will read (before any reset).
        mode: 'exact' | 'jacobi' (D = n_iter, DESIGN.md 6) | 'plain' (no recurrence in the prompt).
        compile: as in generate; the exact prefill's token-by-token span steps compiled."""
        T = idx.size(1)
        if self.rec == 'none':
            x = self.run_blocks(self.wte(idx), 0, self.config.n_layer - 1, range(T), None, cache)
            return self._logits_loss(x, None)[0], None
        if mode == 'exact':
            x, state = self._exact(idx, cache, step=self.compiled('_span_step', compile) if compile else None)
        elif mode == 'jacobi':
            # the state of the last prompt token from the final pass (one refinement beyond
            # the official code, which seeds decoding from its last iteration)
            x, state_in, h = self._jacobi(idx, n_iter, 0, cache)
            state = self.next_state(h[:, -1:], state_in[:, -1:])[:, 0]
        elif mode == 'plain':
            x = self.run_blocks(self.wte(idx), 0, self.e, range(T), None, cache)
            plain = torch.zeros(idx.size(0), 1, dtype=torch.bool, device=idx.device)
            state = self.next_state(x[:, -1:], None, plain)[:, 0]  # a plain token hands on its raw h^(e) (T2MLR)
            x = self.run_blocks(x, self.e + 1, self.config.n_layer - 1, range(T), None, cache)
        else:
            raise ValueError(f"unknown prefill mode {mode!r}; expected 'exact', 'jacobi' or 'plain'")
        return self._logits_loss(x, None)[0], state

    @torch.no_grad()
    def decode_step(self, tok, pos, state, cache):
        """One forward pass for one new token per sequence. tok: (B, 1) at position pos,
        a (1,) long tensor (or an int); state: (B, d) from token pos-1. Returns (logits
        (B, 1, V), new state (B, d)). The static step: the cache is a preallocated buffer
        written in place and attended over whole, under a mask built from pos, so no shape
        depends on pos and torch.compile compiles it once (generate(compile=True))."""
        if not torch.is_tensor(pos):
            pos = torch.tensor([pos], device=tok.device)
        x = self.wte(tok)
        if self.rec == 'none':
            return self._logits_loss(self.run_blocks(x, 0, self.config.n_layer - 1, pos, None, cache), None)[0], None
        st = self._reset(state[:, None], tok)
        kv = self.shared_kv(st)  # once per token, for every layer
        h = self.run_blocks(x, 0, self.e, pos, st, cache, None, kv)
        new_state = self.next_state(h, st)[:, 0]
        x = self.run_blocks(h, self.e + 1, self.config.n_layer - 1, pos, st, cache, None, kv)
        return self._logits_loss(x, None)[0], new_state

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prefill='exact',
                 prefill_iters=8, return_logits=False, generator=None, stop_token=None, on_token=None,
                 compile=False):
        """idx: (B, T0) prompts of equal length. Exactly one forward pass per new token
        after the prefill. temperature 0 = greedy. Returns (B, T0 + max_new_tokens)
        tokens, and with return_logits the (B, T0 + max_new_tokens - 1, V) logits that
        produced every next token. on_token(tokens so far) is called after each new
        token (for streaming); with stop_token, generation ends early once every row has
        produced it (rows that stopped earlier run on: cut them at their first stop_token).
        compile: False (eager), True (torch.compile'd decode_step and exact-prefill span
        step, compiled once per batch size and length) or a torch.compile mode, e.g.
        'reduce-overhead' (CUDA graphs). The same decode_step runs either way."""
        B, T0 = idx.shape
        if T0 + max_new_tokens > self.config.block_size:
            raise ValueError(f"prompt {T0} + {max_new_tokens} new tokens exceeds block_size {self.config.block_size}")
        cache = KVCache(self.config.n_layer, T0 + max_new_tokens)
        logits, state = self.prefill(idx, cache, prefill, prefill_iters, compile)
        decode = self.compiled('decode_step', compile) if compile else self.decode_step
        all_logits = [logits]
        out = [idx]
        done = torch.zeros(B, 1, dtype=torch.bool, device=idx.device)
        for step in range(max_new_tokens):
            tok = sample(logits[:, -1], temperature, top_k, generator)  # (B, 1)
            out.append(tok)
            if on_token is not None:
                on_token(torch.cat(out, 1))
            if stop_token is not None:
                done |= tok == stop_token
                if done.all():
                    break
            if step < max_new_tokens - 1:
                logits, state = decode(tok, torch.tensor([T0 + step], device=idx.device), state, cache)
                if 'reduce-overhead' in (compile, getattr(compile, 'get', dict().get)('mode')):
                    # CUDA graph outputs are overwritten by the next replay
                    logits, state = logits.clone(), state if state is None else state.clone()
                all_logits.append(logits)
        out = torch.cat(out, 1)
        return (out, torch.cat(all_logits, 1)) if return_logits else out

    def compiled(self, name, compile=True):
        """torch.compile'd self.<name> (a static step: 'decode_step' or '_span_step'),
        built once per model and setting. compile: True, a torch.compile mode string
        ('reduce-overhead': CUDA graphs), or a dict of torch.compile arguments (e.g.
        backend='eager' in tests). A torch without a working compiler backend fails at
        the first call: CompileError."""
        kw = {} if compile is True else dict(mode=compile) if isinstance(compile, str) else dict(compile)
        key = (name, tuple(sorted(kw.items())))
        fns = self.__dict__.setdefault('_compiled_steps', {})
        if key not in fns:
            fns[key] = _first_call_checked(torch.compile(getattr(self, name), dynamic=False, **kw), kw)
        return fns[key]

    # ------------------------------------------------------------------
    # optimizer groups and FLOPs

    def param_groups(self, weight_decay, rec_lr_mult=1.0):
        """AdamW groups: decay on matrices (dim >= 2) only; norms, biases and the gate
        scalars undecayed. The recurrence's own parameters get lr_mult = rec_lr_mult
        (the retrofit recipe uses 100). train.py sets lr = base_lr * lr_mult."""
        groups = {}
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            decay = p.dim() >= 2
            mult = rec_lr_mult if self.is_rec_param(name) else 1.0
            g = groups.setdefault((decay, mult), dict(params=[], weight_decay=weight_decay if decay else 0.0, lr_mult=mult))
            g['params'].append(p)
        return list(groups.values())

    def layer_flops(self, T):
        """Forward FLOPs per token of one block, attention over a context of T (2 per MAC)."""
        c = self.config
        hd = c.n_embd // c.n_head
        dkv = c.n_kv_head * hd
        mats = c.n_embd * (2 * c.n_embd + 2 * dkv) + 3 * c.n_embd * c.mlp_hidden
        attn = 4 * c.n_head * hd * T  # QK^T and AV over T keys (nanoGPT's convention, no causal halving)
        return 2 * mats + attn

    def rec_flops(self):
        """Forward FLOPs per token the recurrence adds (fusion, or LRT projections/gates)."""
        c = self.config
        d, dkv = c.n_embd, c.n_kv_head * (c.n_embd // c.n_head)
        if self.rec == 't2mlr':
            return 2 * ((d * d if c.rec_proj else 0) + 2 * (2 * d) * d)  # W_rec + f_cur + f_rec
        if self.rec == 'lrt':
            n_read = c.n_layer - self.s
            f = 0
            if self.lrt_fb is not None:
                f += 2 * 2 * d * dkv * (1 if c.lrt_shared else n_read)  # W_fb_k, W_fb_v
                f += 2 * d * 2 * c.n_kv_head * n_read                   # W_g
            return f
        return 0

    def flops_per_token(self, T, mode='plain', n_iter=8, n_grad=4, n_subsets=2, train=True, n_rounds=1):
        """FLOPs per token of one step (forward, plus backward at 2x forward if train),
        counting every extra pass a scheme makes (cost model of DESIGN.md 6 and 7)."""
        c = self.config
        L, lf, hf = c.n_layer, self.layer_flops(T), 2 * c.n_embd * c.vocab_size
        below, span, above = self.s, self.e - self.s + 1, L - 1 - self.e
        rec = self.rec_flops()
        if self.rec == 'none' or mode in ('plain',):
            fwd = bwd = L * lf + hf
        elif mode in ('exact',):
            fwd = bwd = L * lf + hf + rec
        elif mode == 'jacobi':
            # D+1 span passes, B+1 of them with gradient; a 'plain' initial pass fuses nothing
            plain = c.jacobi_init == 'plain'
            fwd = (below + (n_iter + 1) * span + above) * lf + hf + (n_iter + 1 - plain) * rec
            bwd = (below + (n_grad + 1) * span + above) * lf + hf + (n_grad + 1 - (plain and n_grad == n_iter)) * rec
        elif mode == 'interleaved':
            # init pass over everything, then R rounds of S subsets of T/S tokens through blocks s..L-1
            fwd = bwd = (below + (1 + n_rounds) * (span + above)) * lf + (1 + n_rounds) * (hf + rec)
        else:
            raise ValueError(f"unknown mode {mode!r}")
        return fwd + (2 * bwd if train else 0)

    @classmethod
    def from_pretrained(cls, name_or_path, dtype=torch.float32, **overrides):
        """A Hugging Face Llama checkpoint (e.g. 'HuggingFaceTB/SmolLM2-135M' or a local
        folder) as a GPT; overrides are GPTConfig fields (recurrence, rec_start, ...).
        The recurrence starts at identity: logits equal the pretrained model's.
        Needs the optional package transformers. See load_hf_llama at the end of the file."""
        return load_hf_llama(name_or_path, dtype, **overrides)

# -----------------------------------------------------------------------------
# helpers

class CompileError(RuntimeError):
    pass


def _first_call_checked(fn, kw):
    """fn, a torch.compile'd function, whose first call turns a compiler failure (no C++
    compiler, no triton, an unsupported torch build) into one CompileError line."""
    ok = []

    def call(*args):
        if ok:
            return fn(*args)
        try:
            out = fn(*args)
        except Exception as e:
            first = (str(e).strip().splitlines() or [''])[0][:200]
            raise CompileError(f"torch.compile({', '.join(f'{k}={v}' for k, v in kw.items())}) failed on this torch/machine: "
                               f"{type(e).__name__}: {first}; run with --compile=False") from None
        ok.append(True)
        return out
    return call


def where_on(rec_on, new, old):
    """new where the recurrence is on (rec_on: (B, T, 1) bool, None = everywhere), else old."""
    if rec_on is None:
        return new
    return torch.where(rec_on.view(rec_on.shape + (1,) * (new.dim() - rec_on.dim())), new, old)


def record(recorder, key, pos, value):
    """Keep value (B, len(pos), ...), computed for the tokens at positions pos (a python
    range, or a long tensor in the static steps), under key. Keys: 'state' (the state read, (B, T, d)), 'gate_cur'/'gate_rec' (T2MLR's
    tanh(g) sigmoid(f), (B, T, d)), 'g.<layer>' (LRT's g_loc, g_fb: (B, T, 2, Hkv)),
    'gamma_m.<layer>'/'alpha_x.<layer>' (norms of LRT's two residual terms)."""
    recorder.setdefault(key, []).append((pos, value.detach()))


def recorded(recorder, key, T):
    """The values recorded under key as one (B, T, ...) tensor by position; where a position
    was computed more than once (Jacobi passes), the last value wins."""
    pieces = recorder[key]
    v0 = pieces[0][1]
    out = v0.new_zeros((v0.size(0), T) + v0.shape[2:])
    for pos, v in pieces:
        out[:, pos if torch.is_tensor(pos) else slice(pos.start, pos.stop, pos.step)] = v
    return out


def ce_loss(logits, targets):
    """Mean cross-entropy over positions with target != -1 (0 if there are none)."""
    logits, targets = logits.reshape(-1, logits.size(-1)), targets.reshape(-1)
    n = (targets != -1).sum().clamp(min=1)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction='sum') / n


def sample(logits, temperature=1.0, top_k=None, generator=None):
    """logits: (B, V) -> (B, 1) token ids. temperature 0 = greedy (argmax)."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
        logits[logits < v[:, [-1]]] = -float('inf')
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)

# -----------------------------------------------------------------------------
# checkpoints: one format for train.py, sample.py and bench.py

class CheckpointError(ValueError):
    pass


def save_checkpoint(ckpt, path):
    """Atomic and durable: write a temporary file next to path, fsync it, rename it over
    path, fsync the folder; so an interrupted save (or a power cut) never destroys the last
    good checkpoint. A save killed mid-write leaves path.tmp.<pid>: remove_stale_tmp."""
    import os
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, 'wb') as f:
        torch.save(ckpt, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _fsync_dir(folder):
    """Make a rename in folder durable (POSIX; a no-op where folders cannot be opened)."""
    import os
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_tmp(path):
    """Delete the temporary files save_checkpoint(..., path) left behind when a process was
    killed mid-save: only names path.tmp.<pid> (our own pattern) whose pid is not alive.
    -> the removed paths."""
    import os
    import re
    folder, name = os.path.split(os.path.abspath(path))
    pattern = re.compile(re.escape(name) + r'\.tmp\.(\d+)$')
    removed = []
    for f in os.listdir(folder) if os.path.isdir(folder) else []:
        m = pattern.match(f)
        if not m or _pid_alive(int(m.group(1))):
            continue
        try:
            os.remove(os.path.join(folder, f))
            removed.append(os.path.join(folder, f))
        except OSError:
            pass
    return removed


def _pid_alive(pid):
    import os
    if pid == os.getpid():
        return False  # our own leftover cannot be mid-write: we are not saving now
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def upgrade_state_dict(sd):
    """Older checkpoints of this repo stored the fused projections as separate matrices:
    wq, wk, wv -> wqkv; w_gate, w_up -> w_gu; lrt_fb_k.j, lrt_fb_v.j -> lrt_fb.j (stacked by rows)."""
    fused = {'.attn.wq.weight': ('.attn.wqkv.weight', ('.attn.wq.weight', '.attn.wk.weight', '.attn.wv.weight')),
             '.mlp.w_gate.weight': ('.mlp.w_gu.weight', ('.mlp.w_gate.weight', '.mlp.w_up.weight'))}
    for key in list(sd):
        for first, (new, parts) in fused.items():
            if key.endswith(first):
                pre = key[:-len(first)]
                sd[pre + new] = torch.cat([sd.pop(pre + p) for p in parts], 0)
        if key.startswith('lrt_fb_k.'):
            j = key.split('.')[1]
            sd[f'lrt_fb.{j}.weight'] = torch.cat([sd.pop(key), sd.pop(f'lrt_fb_v.{j}.weight')], 0)
    return sd


def load_checkpoint(path, device='cpu'):
    """Returns (model, ckpt). ckpt holds at least 'model' (state dict) and
    'model_args' (GPTConfig fields). Every failure is one CheckpointError line."""
    import os
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location=device, weights_only=False)
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable checkpoint (corrupt or truncated?): {type(e).__name__}: {e}") from None
    if not isinstance(ckpt, dict) or 'model' not in ckpt or 'model_args' not in ckpt:
        raise CheckpointError(f"{path} is not a checkpoint of this repo (no 'model'/'model_args')")
    known = set(GPTConfig.__dataclass_fields__)
    unknown = set(ckpt['model_args']) - known
    if unknown:
        raise CheckpointError(f"{path} has model args this code does not know: {sorted(unknown)}")
    try:
        model = GPT(GPTConfig(**ckpt['model_args']))
    except ValueError as e:
        raise CheckpointError(f"{path}: invalid model args: {e}") from None
    sd = upgrade_state_dict({k.removeprefix('_orig_mod.').removeprefix('module.'): v for k, v in ckpt['model'].items()})
    if {v.dtype for v in sd.values() if v.is_floating_point()} == {torch.float64}:
        model = model.double()  # a float64 run (tests): loading into float32 would round the weights
    try:
        model.load_state_dict(sd)
    except RuntimeError as e:
        first = str(e).strip().splitlines()
        raise CheckpointError(f"{path}: weights do not fit the model: {' '.join(first[:2])[:300]}") from None
    return model.to(device), ckpt

# -----------------------------------------------------------------------------
# retrofit: a pretrained Hugging Face Llama checkpoint (SmolLM2, ...) as a GPT

# our parameter name -> LlamaForCausalLM's ({i}: layer index); a tuple: our matrix is
# theirs stacked by rows (fused projections). Both use the rotate_half RoPE convention
# on q/k as stored, so no weight is permuted.
HF_LLAMA_NAMES = {
    'wte.weight': 'model.embed_tokens.weight',
    'h.{i}.ln_1.weight': 'model.layers.{i}.input_layernorm.weight',
    'h.{i}.attn.wqkv.weight': ('model.layers.{i}.self_attn.q_proj.weight', 'model.layers.{i}.self_attn.k_proj.weight',
                               'model.layers.{i}.self_attn.v_proj.weight'),
    'h.{i}.attn.wo.weight': 'model.layers.{i}.self_attn.o_proj.weight',
    'h.{i}.ln_2.weight': 'model.layers.{i}.post_attention_layernorm.weight',
    'h.{i}.mlp.w_gu.weight': ('model.layers.{i}.mlp.gate_proj.weight', 'model.layers.{i}.mlp.up_proj.weight'),
    'h.{i}.mlp.w_down.weight': 'model.layers.{i}.mlp.down_proj.weight',
    'ln_f.weight': 'model.norm.weight',
    'lm_head.weight': 'lm_head.weight',
}


def hf_llama_config_args(hf, name):
    """GPTConfig fields from a transformers config. Anything this GPT would not
    reproduce exactly (biases, another activation, scaled RoPE, ...) is an error."""
    def bad(msg):
        raise CheckpointError(f"{name}: {msg}")
    if hf.model_type != 'llama':
        bad(f"model_type {hf.model_type!r} is not a Llama-architecture checkpoint (from_pretrained loads model_type 'llama', e.g. SmolLM2)")
    if getattr(hf, 'hidden_act', 'silu') != 'silu':
        bad(f"hidden_act {hf.hidden_act!r} is not supported (the MLP is SwiGLU: silu)")
    for k in ('attention_bias', 'mlp_bias'):
        if getattr(hf, k, False):
            bad(f"{k}=True is not supported (this GPT has no biases)")
    n_head = hf.num_attention_heads
    head_dim = getattr(hf, 'head_dim', None) or hf.hidden_size // n_head
    if head_dim * n_head != hf.hidden_size:
        bad(f"head_dim={head_dim} is not supported (this GPT needs head_dim * num_attention_heads = hidden_size = {hf.hidden_size})")
    rope = dict(getattr(hf, 'rope_parameters', None) or {})  # transformers >= 5
    scaling = rope or dict(getattr(hf, 'rope_scaling', None) or {})  # transformers 4
    rope_type = scaling.get('rope_type', scaling.get('type', 'default'))
    if rope_type != 'default':
        bad(f"rope scaling {rope_type!r} is not supported (only plain RoPE: rope_type 'default')")
    return dict(block_size=hf.max_position_embeddings, vocab_size=hf.vocab_size,
                n_layer=hf.num_hidden_layers, n_head=n_head,
                n_kv_head=getattr(hf, 'num_key_value_heads', None) or n_head,
                n_embd=hf.hidden_size, mlp_hidden=hf.intermediate_size,
                rope_theta=float(rope.get('rope_theta', getattr(hf, 'rope_theta', 10000.0))),
                norm_eps=float(hf.rms_norm_eps), tie_embeddings=bool(hf.tie_word_embeddings))


def load_hf_llama(name_or_path, dtype=torch.float32, **overrides):
    """GPT.from_pretrained. Weights are read in the checkpoint's dtype and copied
    (exactly, upcast) into a model built in `dtype` (float32 by default; float64
    builds float64 RoPE tables too). block_size may be overridden; the other
    backbone fields come from the checkpoint. The recurrence starts at identity:
    T2MLR's gates g_cur = g_rec = 0 always; LRT gets lrt_identity_init=True unless
    the caller passes lrt_identity_init=False. T2MLR defaults to rec_gate_gain=1e-2
    (DESIGN.md 3, fine-tuning). Every failure is one CheckpointError/ImportError line."""
    import os
    try:
        from transformers import AutoConfig, LlamaForCausalLM
    except ImportError:
        raise ImportError("GPT.from_pretrained needs the optional package transformers: pip install transformers") from None
    name = str(name_or_path)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    local = os.path.isdir(os.path.expanduser(name))
    if not local and (os.path.isabs(name) or name.startswith(('.', '~')) or os.path.exists(name)):
        raise CheckpointError(f"no checkpoint folder at {name}")
    name = os.path.expanduser(name) if local else name

    def one_line(e):
        return ' '.join(str(e).split())[:300]
    try:
        hf_config = AutoConfig.from_pretrained(name)
    except Exception as e:
        if local:
            raise CheckpointError(f"{name}: no readable config.json: {one_line(e)}") from None
        raise CheckpointError(f"{name!r} is not a local folder and could not be fetched from the Hugging Face Hub "
                              f"(offline, or no such repo?): {one_line(e)}") from None
    args = hf_llama_config_args(hf_config, name)
    fixed = (set(args) - {'block_size'}) & set(overrides)
    if fixed:
        raise CheckpointError(f"{name}: {sorted(fixed)} are set by the checkpoint and cannot be overridden")
    unknown = set(overrides) - set(GPTConfig.__dataclass_fields__)
    if unknown:
        raise CheckpointError(f"{name}: unknown GPTConfig fields {sorted(unknown)}")
    if overrides.get('recurrence') == 'lrt':
        overrides.setdefault('lrt_identity_init', True)
    if overrides.get('recurrence') == 't2mlr':
        overrides.setdefault('rec_gate_gain', 1e-2)
    config = GPTConfig(**{**args, **overrides})  # invalid overrides: GPTConfig's own ValueError

    try:
        hf = LlamaForCausalLM.from_pretrained(name, dtype='auto')  # the checkpoint's own dtype
    except Exception as e:
        raise CheckpointError(f"{name}: could not load the weights: {one_line(e)}") from None
    theirs = hf.state_dict()
    sd = {}
    for ours, key in HF_LLAMA_NAMES.items():
        if ours == 'lm_head.weight' and config.tie_embeddings:
            theirs.pop(key, None)  # the same tensor as the embedding
            continue
        for i in (range(config.n_layer) if '{i}' in ours else [None]):
            parts = []
            for k in ((key,) if isinstance(key, str) else key):
                k = k.format(i=i)
                if k not in theirs:
                    raise CheckpointError(f"{name}: the checkpoint has no weight {k}")
                parts.append(theirs.pop(k))
            sd[ours.format(i=i)] = torch.cat(parts, 0)  # fused projections: stacked by rows
    if theirs:
        raise CheckpointError(f"{name}: weights this GPT has no place for: {sorted(theirs)[:5]}")
    del hf

    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if dtype == torch.float64 else torch.float32)
    try:
        model = GPT(config)  # recurrence parameters initialised at identity
    finally:
        torch.set_default_dtype(prev)
    try:
        missing, _ = model.load_state_dict(sd, strict=False)  # exact upcast to the model's dtype
    except RuntimeError as e:
        raise CheckpointError(f"{name}: weights do not fit the config: {one_line(e)}") from None
    missing = [k for k in missing if not GPT.is_rec_param(k) and not (k == 'lm_head.weight' and config.tie_embeddings)]
    assert not missing, f"backbone weights not loaded: {missing}"
    return model.to(dtype)
