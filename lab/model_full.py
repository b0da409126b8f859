"""
The research model: model.py's GPT with every option the lab's configs and arms use (the official
codes' options, block training, interleaved rounds, recomputation, prompt masks, LRT's inject modes
and gate channels, RoPE off, dropout, a retrofit's gains). It shares model.py's backbone, KV cache
and helpers; at the settings they share the two give the same losses and gradients
(tests/test_textbook.py). Every checkpoint this repo wrote before model.py was split loads here.
What follows is the older docstring, still true of this file:
One GPT with latent token-to-token recurrence. A Llama-style
decoder plus a constant-size state that carries the hidden state of token t-1 at a source
layer e (rec_end) into an earlier layer s (rec_start) of token t (docs/DESIGN.md 3, 4):
  't2mlr'  T2MLR: a gated fusion Phi(h, R) at the input of block s; R_t read after block e.
  'lrt'    LRT: the memory m_t = rmsnorm(h^(e)_t) injected into every block >= s, into the
           residual stream and into each token's own key/value.
Layers are 0-based; h^(l)_t is the residual stream at the OUTPUT of block l for token t.
  below = blocks 0..s-1     never read the state: always in parallel
  span  = blocks s..e       read the state and produce the next one: the recurrence
  above = blocks e+1..L-1   read the state (LRT) or not (T2MLR), never feed it: in parallel
Every path (exact, Jacobi, interleaved, prefill, decode) is built on one primitive, run_blocks:
"run blocks a..b for the tokens at positions pos, each reading its state, over this KV cache".
engine.py runs the same steps fast: static shapes for torch.compile and CUDA graphs.
"""

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import model as textbook
from model import Attention, KVCache, MLP, RMSNorm, apply_rope, attend, causal_mask, ce_loss, rope_tables, sample  # noqa: F401 (the shared backbone)
from support.checks import check_decode_step, check_generate, check_model_config, check_scheme

# -----------------------------------------------------------------------------
# config

@dataclass
class GPTConfig(textbook.GPTConfig):
    """model.GPTConfig's fields, then the lab's (their order in asdict: the textbook's first)."""
    mlp_hidden: int = 0         # SwiGLU hidden width; 0 = 8/3 * n_embd rounded up to 64
    rope_theta: float = 10000.0
    rope: bool = True           # False: no positional encoding at all (NoPE; the official S5-Retrieval recipe)
    norm_eps: float = 1e-5
    dropout: float = 0.0        # on each block's two residual branches and the embeddings
    tie_embeddings: bool = True
    # T2MLR options (DESIGN.md 3)
    rec_residual: bool = True   # m_t = h^(e)_t + R_{t-1} (else m_t = h^(e)_t)
    rec_proj: bool = True       # r = W_rec R (else r = R)
    rec_gate_gain: float = 1.0  # xavier gain of f_cur/f_rec (a retrofit's: 1e-2, from_pretrained)
    rec_residual_detach: bool = False  # m_t = h^(e)_t + sg(R_{t-1}): no gradient through the residual (official option)
    rec_scale_min: float = 0.2  # the bounds of the state's RMS scale, clamp(1/rms(m_t), min, max) (official: 1/5, 5)
    rec_scale_max: float = 5.0
    # LRT options (DESIGN.md 4)
    lrt_inject: str = 'both'    # 'kv' | 'residual' | 'both'
    lrt_identity_init: bool = False  # gamma=0, W_fb=0: starts equal to the plain GPT
    lrt_gate_channels: int = 0  # the gates read the first this-many channels of the normed input; 0 = all (DESIGN.md 11)
    # the lab's training options, settings of lab/train.py (train.py under this model) through these fields
    n_rounds: int = 1           # interleaved: R rounds of the S refinements (exact positions 0..R*S-1)
    block_len: int = 4          # train_mode 'block': C, the chunk length (the state crosses chunk boundaries only)
    recompute: bool = False     # activation checkpointing: the passes that keep a graph are recomputed in backward
    rec_lr_mult: float = 1.0    # lr multiplier of the recurrence's own parameters (a retrofit's: 100)
    arch: str = 'gpt'           # 'gpt' | 'lstm': the LSTM baseline (support/lstm.py), n_layer layers of n_embd
    jacobi_inits = ('plain', 'zero', 'exact')  # 'zero': one iteration from the zero state

    def __post_init__(self):
        self.mlp_hidden = self.mlp_hidden or 64 * math.ceil(8 * self.n_embd / 3 / 64)
        self.rec_end = self.n_layer - 1 if self.rec_end == -1 else self.rec_end
        self.validate()

    @property
    def padded_vocab(self):
        return self.vocab_pad * math.ceil(self.vocab_size / self.vocab_pad)

    def validate(self):  # the one check of a model's settings (support/checks.py): a ValueError naming the first broken
        check_model_config(self)

# -----------------------------------------------------------------------------
# what a run of blocks reads: model.StateIn, and where the recurrence is on, LRT's inject modes and gate channels

class StateIn(textbook.StateIn):
    """model.StateIn plus on (B, T, 1) bool, where the recurrence is on (None: everywhere): off, a
    token runs as the plain model although it has a state (T2MLR's prompt in fine-tuning). LRT
    with lrt_inject 'kv' has no alpha/gamma, with 'residual' no gates and W_fb (then None)."""

    def __init__(self, model, state, rec_mask=None):
        self.s, self.fusion, self.lrt, self.state = model.s, model.fusion, model.lrt, state
        self.on = None if rec_mask is None else rec_mask.unsqueeze(-1)
        shared = self.lrt is not None and self.lrt.w_fb is not None and self.lrt.shared
        self.mem_kv = self.lrt.project(0, state) if shared else None

    def enter(self, i, x):
        if i == self.s and self.fusion is not None:
            return where_on(self.on, self.fusion(x, self.state), x)
        if i >= self.s and self.lrt is not None and self.lrt.alpha is not None:
            return where_on(self.on, self.lrt.residual(i - self.s, x, self.state), x)
        return x

    def gated_kv(self, i, a, qkv):
        if i < self.s or self.lrt is None or self.lrt.gate is None:
            return qkv
        a = a[..., :self.lrt.gate[0].in_features]  # the gates read the first lrt_gate_channels channels (DESIGN.md 11)
        return where_on(self.on, self.lrt.gated_kv(i - self.s, a, qkv, self.state, self.mem_kv), qkv)

# -----------------------------------------------------------------------------
# the model

class GPT(textbook.GPT):

    def __init__(self, config):
        super().__init__(config)  # model.GPT, its init; then what the lab's settings change
        c = config
        self.drop = nn.Dropout(c.dropout)  # the embeddings' and (hooks) each block's two branches'
        for b in self.h if c.dropout > 0 else []:
            for branch in (b.attn, b.mlp):
                branch.register_forward_hook(lambda mod, inp, out: F.dropout(out, c.dropout, mod.training))
        if not c.rope:  # NoPE: rotate by angle 0 (cos 1, sin 0), so apply_rope is the identity, exactly
            self.rope_cos.fill_(1.0), self.rope_sin.zero_()
        if self.fusion is not None and not c.rec_proj:
            self.fusion.w_rec = nn.Identity()  # r = R
        if self.lrt is not None:
            lrt, n = self.lrt, c.n_layer - self.s
            if c.lrt_inject == 'kv':
                lrt.alpha = lrt.gamma = None
            if c.lrt_inject == 'residual':
                lrt.w_fb = lrt.gate = None
            elif c.lrt_gate_channels:  # the gates read the first lrt_gate_channels channels, start at 1
                lrt.gate = nn.ModuleList([nn.Linear(c.lrt_gate_channels, 2 * c.n_kv_head, bias=False) for _ in range(n)])
                lrt.init_weights()
            if c.lrt_identity_init:  # gamma = 0, W_fb = 0: starts equal to the plain GPT
                for p in ([lrt.gamma] if lrt.gamma is not None else []) + [l.weight for l in lrt.w_fb or []]:
                    nn.init.zeros_(p)

    def state_input(self, state, rec_mask=None):
        return StateIn(self, state, rec_mask)

    def below(self, idx, cache=None):  # the embeddings' dropout
        return self.run_blocks(self.drop(self.wte(idx)), 0, self.s - 1, range(idx.size(1)), None, cache)

    def next_state(self, h, state, rec_mask=None):
        """The state a token hands on to the next, from h = h^(e)_t and the state it read (B, T, d).
        A T2MLR token that ran as the plain model (rec_mask False) hands on its raw h^(e)_t (the official code)."""
        if self.rec == 't2mlr':
            # m_t = h^(e)_t + R_{t-1};  R_t = m_t * clamp(1/rms(m_t), 1/5, 5), the scale under detach
            # (the bounds are rec_scale_min/max: at the lower one the state's RMS exceeds 1)
            detach = state is not None and self.config.rec_residual_detach  # the official S5, GSM8K recipes
            R = state.detach() if detach else state  # (no gradient through the residual)
            m = h + R if (self.config.rec_residual and R is not None) else h
            scale = torch.rsqrt(m.detach().pow(2).mean(-1, keepdim=True) + 1e-6)
            scale = scale.clamp(self.config.rec_scale_min, self.config.rec_scale_max)
            return where_on(None if rec_mask is None else rec_mask.unsqueeze(-1), m * scale, h)
        # LRT: m_t = rmsnorm(h^(e)_t), no weight, at every position
        return F.rms_norm(h, (h.size(-1),), eps=self.config.norm_eps)

    def shift_states(self, states, idx, rec_mask=None):
        """states: (B, T, d) handed on by tokens 0..T-1 -> (B, T, d) read by tokens 0..T-1:
        shift(X)[:, t] = X[:, t-1], zero at t = 0 and at document starts (reset token)."""
        return self.reset(F.pad(states[:, :-1], (0, 0, 1, 0)), idx, rec_mask)

    def reset(self, state, idx, rec_mask=None):
        # model.GPT.reset, and the state read is 0 where the recurrence is off
        state = super().reset(state, idx)
        if rec_mask is not None:
            state = state * rec_mask.unsqueeze(-1).to(state.dtype)
        return state

    def span(self, x, state_in, cache=None, recompute=False):
        # blocks s..e over the whole sequence, reading state_in; recompute: keep only the inputs, rerun in backward
        run = lambda x: self.run_blocks(x, self.s, self.e, range(x.size(1)), state_in, cache)
        return checkpoint(run, x, use_reentrant=False) if recompute and torch.is_grad_enabled() else run(x)

    # ------------------------------------------------------------------
    # forward passes: the three training schemes and the exact recurrence. Each one returns
    # (logits (B, T, V), loss, the state each token hands on (B, T, d))

    def forward(self, idx, targets=None, mode='exact', n_iter=8, n_grad=4, n_subsets=2, rec_mask=None, n_rounds=None,
                recompute=None, block_len=None):
        """idx, targets: (B, T) token ids (targets -1 = no loss). Returns (logits (B, T, V), loss).
        mode: 'plain'        the backbone alone, recurrence bypassed
              'exact'        the exact sequential recurrence (what generation computes)
              'jacobi'       Jacobi iterations (D = n_iter, gradient through the last n_grad)
              'interleaved'  n_subsets strided subsets refined in order, n_rounds times
              'block'        chunks of block_len tokens in order, the state crossing chunk boundaries only
              'zero'         every position reads an all-zero state (one chunk of T tokens)
        rec_mask: optional (B, T) bool, where the recurrence is on (default: everywhere).
        recompute: activation checkpointing of the passes that keep a graph (recomputed in backward).
        With recurrence='none' every mode is the plain parallel forward."""
        T = idx.size(1)
        if T > self.config.block_size:
            raise ValueError(f"sequence length {T} exceeds block_size {self.config.block_size}")
        c = self.config  # n_rounds, recompute, block_len: the config's where not given
        n_rounds, recompute = c.n_rounds if n_rounds is None else n_rounds, c.recompute if recompute is None else recompute
        block_len = c.block_len if block_len is None else block_len
        check_scheme(mode, n_iter, n_grad, n_subsets, n_rounds, T, block_len)
        if self.rec == 'none' or mode == 'plain':
            return self.head(self.run_blocks(self.drop(self.wte(idx)), 0, self.config.n_layer - 1, range(T)), targets)
        if mode in ('exact', 'zero', 'block'):
            out = self._sequential(idx, targets, {'exact': 1, 'zero': T, 'block': block_len}[mode], None, rec_mask)
        elif mode == 'jacobi':
            out = self._jacobi(idx, targets, n_iter, n_grad, rec_mask, recompute)
        else:
            out = self._interleaved(idx, targets, n_subsets, n_rounds, rec_mask, recompute)
        return out[:2]

    def _sequential(self, idx, targets=None, C=1, cache=None, rec_mask=None):
        """The span run in order, C tokens at a time, each chunk's first token reading the state
        the token before handed on, the others 0. C = 1: the exact recurrence (DESIGN.md 5), token
        t reads the state token t-1 handed on. C > 1: block training (DESIGN.md 7; the LRT paper's
        baseline). C = T: no state at all (mode 'zero': loss(zero) - loss(exact) is what it carries).
        Below and above the span run in parallel."""
        cache = KVCache(self.config.n_layer, idx.size(1)) if cache is None else cache
        h, read, new = self._span_in_order(self.below(idx, cache), idx, C, cache, rec_mask)
        return *self.above(h, self.state_input(read, rec_mask), cache, targets), new

    def _span_in_order(self, x, idx, C, cache, rec_mask=None):
        # the span over x (B, T, d), C tokens at a time -> (h^(e), the states read, the states handed on), each (B, T, d)
        T, state, outs = idx.size(1), x.new_zeros(x.size(0), 1, self.config.n_embd), []  # R_{-1} = 0
        for t in range(0, T, C):
            u = min(t + C, T)
            st = state if u - t == 1 else F.pad(state, (0, 0, 0, u - t - 1))  # (B, u - t, d): 0 after the first
            outs.append(self.span_step(x[:, t:u], idx[:, t:u], range(t, u), st, cache,
                                       None if rec_mask is None else rec_mask[:, t:u]))
            state = outs[-1][2][:, -1:]
        return tuple(torch.cat(z, 1) for z in zip(*outs))

    def span_step(self, x, idx, pos, state, cache, rec_mask=None):
        """One token through the span: x (B, 1, d) its input to block s, idx (B, 1) the token, state
        (B, 1, d) what the token before handed on. -> (h^(e), the state read, the state handed on).
        (A chunk: n tokens at once, x, idx, state (B, n, ...), the states each one reads.)"""
        read = self.reset(state, idx, rec_mask)
        h = self.run_blocks(x, self.s, self.e, pos, self.state_input(read, rec_mask), cache)
        return h, read, self.next_state(h, read, rec_mask)

    def _jacobi(self, idx, targets, n_iter, n_grad, rec_mask=None, recompute=False):
        """Jacobi fixed-point iterations over the span (DESIGN.md 6), as the official code runs them
        (D = n_iter): 1. a first guess of the states read (_jacobi_guess); 2. D-1 iterations, the
        last n_grad with gradient; 3. a final pass, the span and the layers above. Exact after it:
        positions 0..D-1 (jacobi_init 'plain'), 0..D ('zero'), all ('exact')."""
        D, grad = n_iter, torch.is_grad_enabled()
        x = self.below(idx)
        with torch.set_grad_enabled(grad and n_grad >= D):  # with gradient only when every pass has it
            state = self._jacobi_guess(x, idx, rec_mask, None, recompute)
        # iteration d has D-1-d left and carries gradient when that is <= n_grad. From the exact
        # states ('exact') the ones without gradient would change nothing: skipped
        first = max(0, D - 1 - (n_grad if grad else 0)) if self.config.jacobi_init == 'exact' else 0
        for d in range(first, D - 1):
            with torch.set_grad_enabled(grad and D - 1 - d <= n_grad):
                state = self._jacobi_step(x, idx, state, rec_mask, None, recompute)
        return self._jacobi_final(x, idx, state, targets, rec_mask, None, recompute)

    def _jacobi_guess(self, x, idx, rec_mask=None, cache=None, recompute=False):
        """Jacobi's first guess of the states read, (B, T, d), from x the input of block s:
        'plain' (official): the span without the state, each token handing on its raw h^(e);
        'zero': one iteration from the zero state; 'exact': the exact loop itself, without gradient."""
        if self.config.jacobi_init == 'exact':  # the states the exact loop reads; no layer above it, no head
            with torch.inference_mode():  # (no autograd bookkeeping at all; clone() makes a normal tensor)
                state = self._span_in_order(x, idx, 1, KVCache(self.config.n_layer, idx.size(1)), rec_mask)[1]
            return state.clone()
        if self.config.jacobi_init == 'zero':
            return self._jacobi_step(x, idx, torch.zeros_like(x), rec_mask, cache, recompute)
        plain = torch.zeros(idx.shape, dtype=torch.bool, device=idx.device)  # no token reads a state
        return self.shift_states(self.next_state(self.span(x, None, cache), None, plain), idx, rec_mask)

    def _jacobi_step(self, x, idx, state, rec_mask=None, cache=None, recompute=False):
        # one iteration: every token runs the span reading its guess (B, T, d) -> the next guess
        h = self.span(x, self.state_input(state, rec_mask), cache, recompute)
        return self.shift_states(self.next_state(h, state, rec_mask), idx, rec_mask)

    def _jacobi_final(self, x, idx, state, targets, rec_mask=None, cache=None, recompute=False):
        # the final pass: the span and the layers above, reading the last guess (one StateIn for both)
        state_in = self.state_input(state, rec_mask)
        h = self.span(x, state_in, cache, recompute)
        return *self.above(h, state_in, cache, targets), self.next_state(h, state, rec_mask)

    def _interleaved(self, idx, targets, n_subsets=2, n_rounds=1, rec_mask=None, recompute=False):
        """Interleaved subset refinement (DESIGN.md 7), subset i = positions t % S == i, refined R =
        n_rounds times over (R > 1: our extension for deep chains; S = 1: the official multi-refine).
        Exact: the first max(R*S, R+1) positions. Logits: each position's from the last pass that
        refined it; loss: the mean of the 1 + R*S pass losses."""
        (B, T), S = idx.shape, n_subsets
        run = self._refine if not (recompute and torch.is_grad_enabled()) else \
            lambda *args: checkpoint(self._refine, *args, use_reentrant=False)  # recomputed in backward
        xs = self.below(idx)
        # 1. init pass with zero memory; keep its keys/values and the states it hands on
        zero = torch.zeros_like(xs)
        h, out, kv = run(xs, zero, range(T), rec_mask, None)
        states = self.next_state(h, zero, rec_mask)  # (B, T, d) the latest state handed on by each token
        logits, loss0 = self.head(out, targets)
        logits, losses = torch.empty_like(logits), [loss0]
        # 2. refine the subsets in order, R times over; each sees the states refined before it
        for _ in range(n_rounds):
            for i in range(S):
                mask = None if rec_mask is None else rec_mask[:, i::S]
                st = self.shift_states(states, idx, rec_mask)[:, i::S]  # memory shift(h_latest) at subset i
                h, out, kv = run(xs[:, i::S], st, range(i, T, S), mask, kv)
                states = states.slice_scatter(self.next_state(h, st, mask), dim=1, start=i, end=T, step=S)
                logits[:, i::S], loss_i = self.head(out, None if targets is None else targets[:, i::S])
                losses.append(loss_i)  # (a later round overwrites an earlier one's logits)
        return logits, None if targets is None else sum(losses) / len(losses), states  # 3. the mean of the pass losses

    def _refine(self, x, state, P, rec_mask, kv):
        """Blocks s..L-1 for the tokens at positions P, reading states state, over the keys/values
        kv = (k, v) of blocks s..L-1 the passes before left (None: the init pass). -> (h^(e), the
        output, the keys/values after): a pure function, so that checkpointing can recompute it."""
        L = self.config.n_layer
        buf = KVCache(L, P.stop)  # P.stop = T for every subset
        if kv is not None:
            buf.k[self.s:], buf.v[self.s:] = kv
        state_in = self.state_input(state, rec_mask)
        h = self.run_blocks(x, self.s, self.e, P, state_in, buf)
        return h, self.run_blocks(h, self.e + 1, L - 1, P, state_in, buf), (buf.k[self.s:], buf.v[self.s:])

    # ------------------------------------------------------------------
    # generation: KV cache + one state vector per sequence, one pass per token

    @torch.no_grad()
    def prefill(self, idx, cache, mode='exact', n_iter=8, tol=None):
        """A prompt into the cache -> (logits (B, T, V), the state the next token reads (B, d), span
        passes). mode: 'exact'; 'jacobi' (D = n_iter; with tol, until no state moves by more than
        tol, at most T iterations: exact by construction); 'plain' (no recurrence in the prompt)."""
        B, T = idx.shape
        if self.rec == 'none':
            return self.head(self.run_blocks(self.wte(idx), 0, self.config.n_layer - 1, range(T), None, cache), None)[0], None, 0
        if mode == 'exact':
            logits, _, states = self._sequential(idx, None, 1, cache)
            return logits, states[:, -1].contiguous(), T  # (B, d) laid out as decode_step's (a compiled step guards strides)
        if mode == 'plain':
            h = self.run_blocks(self.wte(idx), 0, self.e, range(T), None, cache)
            plain = torch.zeros(B, 1, dtype=torch.bool, device=idx.device)
            state = self.next_state(h[:, -1:], None, plain)[:, 0]  # a plain token hands on its raw h^(e) (T2MLR)
            return self.above(h, None, cache, None)[0], state, 0
        if mode != 'jacobi':
            raise ValueError(f"unknown prefill mode {mode!r}; expected 'exact', 'jacobi' or 'plain'")
        x = self.below(idx, cache)
        state, passes = self._jacobi_guess(x, idx, None, cache), 2  # the guess and the final pass
        for _ in range(0 if self.config.jacobi_init == 'exact' else (T if tol is not None else n_iter) - 1):
            new = self._jacobi_step(x, idx, state, None, cache)
            converged = tol is not None and (new - state).abs().max().item() <= tol
            state, passes = new, passes + 1
            if converged:  # a fixed point: more iterations change nothing
                break
        # the state of the last prompt token from the final pass (one refinement beyond the
        # official code, which seeds decoding from its last iteration)
        logits, _, states = self._jacobi_final(x, idx, state, None, None, cache)
        return logits, states[:, -1].contiguous(), passes

    @torch.no_grad()
    def decode_step(self, tok, pos, state, cache):
        """One forward pass for one new token per sequence. tok: (B, 1) at position t, pos =
        range(t, t + 1) (or the (1,) tensor [t]: engine.py); state: (B, d) from token t-1.
        -> (logits (B, 1, V), new state (B, d))."""
        check_decode_step(self.config, tok, pos, state, cache)
        return super().decode_step(tok, pos, state, cache)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, prefill='exact', prefill_iters=8,
                 return_logits=False, generator=None, stop_token=None, on_token=None, runner=None, prefill_tol=None):
        """model.GPT.generate, checked, with the prefill modes 'jacobi' (prefill_iters passes, or with
        prefill_tol until no state moves by more than it) and 'plain'."""
        check_generate(self.config, idx, max_new_tokens, temperature, top_k, prefill, prefill_iters, prefill_tol)
        return super().generate(idx, max_new_tokens, temperature, top_k, prefill, prefill_iters, return_logits, generator,
                                stop_token, on_token, runner, tol=prefill_tol)

    def param_groups(self, weight_decay, gate_lr_mult=1.0, rec_lr_mult=None):
        """model.GPT.param_groups, and: the recurrence's own parameters at lr_mult = rec_lr_mult (default
        the config's; the retrofit recipe: 100), the gates that times gate_lr_mult."""
        groups = {}
        for name, p in self.named_parameters():
            if not p.requires_grad:
                continue
            rec = self.is_rec_param(name)
            mult = ((self.config.rec_lr_mult if rec_lr_mult is None else rec_lr_mult) if rec else 1.0) * (gate_lr_mult if p.dim() == 0 else 1.0)
            wd = 0.0 if p.dim() < 2 else weight_decay
            g = groups.setdefault((p.dim(), wd, mult), dict(params=[], weight_decay=wd, lr_mult=mult))  # by kind: resumable
            g['params'].append(p)
        return list(groups.values())

# -----------------------------------------------------------------------------
# helpers

def where_on(rec_on, new, old):
    """new where the recurrence is on (rec_on: (B, T, 1) bool, None = everywhere), else old."""
    return new if rec_on is None else torch.where(rec_on.view(rec_on.shape + (1,) * (new.dim() - rec_on.dim())), new, old)
