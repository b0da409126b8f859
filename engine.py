"""
Fast decoding for a trained model: model.py's own prefill and decode steps, run in a static
shape so that torch.compile compiles each step once (and mode='reduce-overhead' records one
CUDA graph that replays). model.py is the method; this file is only how to run it fast (as
nanochat keeps engine.py apart from gpt.py). What changes, and why:
  - the position is a (1,) long tensor, not a Python int: no shape or guard depends on it;
  - the KV cache is a buffer of max_len positions written in place (index_copy_), and every
    step attends over all of it under a mask (keys past the token masked off);
  - the buffers have fixed addresses (marked static) and one cache per (batch, length) is kept
    across generate calls, so a CUDA graph recorded once replays; its outputs are cloned.
The tokens equal eager GPT.generate's (tests/test_decode.py, tests/test_gpu_ready.py).

    engine = Engine(model, compile=True)   # or a mode: 'reduce-overhead', or torch.compile's kwargs
    out = engine.generate(idx, 100, temperature=0)
"""

import torch

from model import GPT, KVCache, causal_mask
from support.checks import check_decode_step


class StaticKVCache(KVCache):
    """model.KVCache whose one-token writes take a (1,) position tensor: written in place, the
    WHOLE buffer (B, Hkv, max_len, hd) returned, so no shape depends on the position. Writes at
    a range of positions (the prompt, the layers outside the span) are model.KVCache's."""

    def _full(self, i, k, v):
        before = self.k[i]
        super()._full(i, k, v)
        if self.k[i] is not before and not torch.compiler.is_compiling():
            for t in (self.k[i], self.v[i]):  # a fixed address, which a CUDA graph may write in place
                torch._dynamo.mark_static_address(t)

    def write(self, i, pos, k, v):
        if not torch.is_tensor(pos):
            return super().write(i, pos, k, v)
        self._full(i, k, v)  # pos: (1,) long, k/v: (B, Hkv, 1, hd); in place: O(1) traffic per token
        self.k[i].index_copy_(2, pos, k)
        self.v[i].index_copy_(2, pos, v)
        return self.k[i], self.v[i]


def static_rope_and_mask(self, pos, cache):
    """GPT.rope_and_mask for a (1,) position tensor: the RoPE row by index_select, and the mask
    over every position of the cache's buffer, (1, max_len) bool."""
    rope = (self.rope_cos.index_select(0, pos)[:, None], self.rope_sin.index_select(0, pos)[:, None])
    return rope, causal_mask(pos, torch.arange(cache.max_len, device=pos.device), self.config.attn_window)


def static_view(model):
    """The model itself (one __dict__: the same parameters, buffers and submodules), seen through
    a subclass whose rope_and_mask takes a position tensor: model.py's span_step and decode_step,
    unchanged, become the static steps."""
    cls = type('Static' + type(model).__name__, (type(model),), {'rope_and_mask': static_rope_and_mask})
    view = object.__new__(cls)
    object.__setattr__(view, '__dict__', model.__dict__)
    return view


class Engine:

    def __init__(self, model, compile=True):
        """model: a GPT (or lstm.LSTM, whose steps have no position to make static). compile: True,
        a torch.compile mode ('reduce-overhead': CUDA graphs), a dict of torch.compile arguments,
        or False (the static steps run eagerly). A compiler that fails does so at the first call
        (configurator.compile_errors makes it one line)."""
        self.model, self.config = model, model.config
        kw = {} if compile in (True, False) else dict(mode=compile) if isinstance(compile, str) else dict(compile)
        self.cuda_graphs = kw.get('mode') == 'reduce-overhead'  # outputs overwritten by the next replay
        steps = static_view(model) if isinstance(model, GPT) else model
        self._decode, self._span = steps.decode_step, getattr(steps, 'span_step', None)
        if compile is not False:
            self._decode = torch.compile(self._decode, dynamic=False, **kw)
            self._span = self._span and torch.compile(self._span, dynamic=False, **kw)
        self.caches = {}  # (B, max_len) -> StaticKVCache, kept across generate calls

    def new_cache(self, B, max_len):
        return self.caches.setdefault((B, max_len), StaticKVCache(self.config.n_layer, max_len))

    def decode_step(self, tok, pos, state, cache):
        """GPT.decode_step, static: pos a range(t, t + 1) or the (1,) tensor [t] (bench.py makes them
        before its clock starts)."""
        if not torch.is_tensor(pos):  # a range: checked (the compiled step cannot index past its RoPE table)
            check_decode_step(self.config, tok, pos, state if isinstance(self.model, GPT) else None, cache)
            pos = torch.tensor([pos.start], device=tok.device)
        logits, state = self._decode(tok, pos, state, cache)
        if self.cuda_graphs:
            logits, state = logits.clone(), None if state is None else state.clone()
        return logits, state

    def span_step(self, x, idx, pos, state, cache, rec_mask=None):
        """GPT.span_step for _exact's loop, static from token 1 on (token 0 allocates the cache)."""
        if pos.start == 0:
            return self.model.span_step(x, idx, pos, state, cache, rec_mask)
        return self._span(x, idx, torch.tensor([pos.start], device=idx.device), state, cache, rec_mask)

    @torch.no_grad()
    def prefill(self, idx, cache, mode='exact', n_iter=8, tol=None):
        """GPT.prefill; the exact recurrence through the compiled span step (the other modes are
        parallel: model.py's)."""
        m = self.model
        if mode != 'exact' or self._span is None or m.rec == 'none':
            return m.prefill(idx, cache, mode, n_iter, tol)
        x, _, state = m._exact(idx, cache, span_step=self.span_step)
        return m._logits_loss(x, None)[0], state, idx.size(1)

    @torch.no_grad()
    def forward(self, idx, targets=None, mode='exact', rec_mask=None, **scheme):
        """GPT.forward's 'exact' and 'zero' modes with the compiled span step: train.py's evaluation.
        scheme: the training schemes' settings (n_iter, ...), which these modes do not read."""
        m = self.model
        if m.config.recurrence == 'none' or mode not in ('exact', 'zero'):  # (an LSTM's config says 'none' too)
            raise ValueError(f"Engine.forward runs the exact and zero modes of a recurrent model, not {mode!r}")
        cache = StaticKVCache(self.config.n_layer, idx.size(1))
        x, _, _ = m._exact(idx, cache, rec_mask, mode == 'zero', span_step=self.span_step)
        return m._logits_loss(x, targets)

    __call__ = forward
    generate = GPT.generate  # model.py's loop, over this engine's new_cache, prefill and decode_step
