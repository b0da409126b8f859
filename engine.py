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
model.py takes such a position itself (GPT.rope_and_mask), so the steps compiled here are the
model's own. The tokens equal eager GPT.generate's (tests/test_decode.py, tests/test_gpu_ready.py).

    engine = Engine(model, compile=True)   # or a mode: 'reduce-overhead', or torch.compile's kwargs
    out = engine.generate(idx, 100, temperature=0)
"""

import torch

from model import GPT, KVCache
from support.checks import check_decode_step
from support.diagnostics import masked


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


class Engine:

    def __init__(self, model, compile=True):
        """model: a GPT (or lstm.LSTM, whose steps have no position to make static). compile: True,
        a torch.compile mode ('reduce-overhead': CUDA graphs), a dict of torch.compile arguments,
        or False (the static steps run eagerly). A compiler that fails does so at the first call
        (configurator.compile_errors makes it one line)."""
        self.model, self.config = model, model.config
        kw = {} if compile in (True, False) else dict(mode=compile) if isinstance(compile, str) else dict(compile)
        self.cuda_graphs = kw.get('mode') == 'reduce-overhead'  # outputs overwritten by the next replay
        self._decode, self._span = model.decode_step, getattr(model, 'span_step', None)  # (an LSTM has no span)
        if compile is not False:
            self._decode = torch.compile(self._decode, dynamic=False, **kw)
            self._span = self._span and torch.compile(self._span, dynamic=False, **kw)
        self.caches = {}  # (B, max_len) -> StaticKVCache, kept across generate calls

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

    def span_step(self, x, idx, pos, state, cache):
        """GPT.span_step, static from token 1 on (token 0 allocates the cache)."""
        if pos.start == 0:
            return self.model.span_step(x, idx, pos, state, cache)
        return self._span(x, idx, torch.tensor([pos.start], device=idx.device), state, cache)

    def exact(self, idx, targets=None, cache=None, rec_mask=None):
        """GPT.exact's loop with the compiled span step -> (logits (B, T, V), loss, the states handed on
        (B, T, d)). With a prompt mask (lab/model_full.py) the model's own loop."""
        cache = StaticKVCache(self.config.n_layer, idx.size(1)) if cache is None else cache
        if rec_mask is not None:
            return self.model._sequential(idx, targets, 1, cache, rec_mask)
        return self.model.exact(idx, targets, cache, step=self.span_step)

    @torch.no_grad()
    def prefill(self, idx, cache, mode='exact', n_iter=8, **kw):
        """GPT.prefill; the exact recurrence through the compiled span step (the other modes are
        parallel: model.py's)."""
        if mode != 'exact' or self._span is None or self.model.rec == 'none':
            return self.model.prefill(idx, cache, mode, n_iter, **kw)
        logits, _, states = self.exact(idx, None, cache)
        return logits, states[:, -1].contiguous(), idx.size(1)  # (B, d) laid out as decode_step's: no recompile

    @torch.no_grad()
    def forward(self, idx, targets=None, mode='exact', rec_mask=None, **scheme):
        """GPT.forward's 'exact' mode with the compiled span step ('zero' is parallel: model.py's):
        train.py's evaluation. scheme: the training schemes' settings (n_iter, ...), which these modes do not read."""
        m = self.model
        if m.config.recurrence == 'none' or mode not in ('exact', 'zero'):  # (an LSTM's config says 'none' too)
            raise ValueError(f"Engine.forward runs the exact and zero modes of a recurrent model, not {mode!r}")
        if mode == 'zero':
            return m(idx, targets, 'zero', **masked(rec_mask))
        return self.exact(idx, targets, None, rec_mask)[:2]

    __call__ = forward

    def new_cache(self, B, max_len):
        return self.caches.setdefault((B, max_len), StaticKVCache(self.config.n_layer, max_len))

    def generate(self, idx, max_new_tokens, **kw):
        """GPT.generate's loop over this engine's cache (kept across calls), prefill and decode_step."""
        return self.model.generate(idx, max_new_tokens, runner=self, **kw)
