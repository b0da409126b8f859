"""
The checks of a model's and a training scheme's settings, and of generation's inputs: the first
one broken is a ValueError naming it (train.py turns it into one line; the scripts check before
any data is read).
"""

import math

import torch


def check_model_config(c):
    """model.GPTConfig's settings (GPTConfig.validate)."""
    for k in ('block_size', 'vocab_size', 'vocab_pad', 'n_layer', 'n_head', 'n_kv_head', 'n_embd', 'mlp_hidden'):
        if getattr(c, k) < 1:
            raise ValueError(f"GPTConfig: {k}={getattr(c, k)} must be >= 1")
    L, s, e, hd = c.n_layer, c.rec_start, c.rec_end, c.n_embd // c.n_head
    rules = [
        (c.n_embd % c.n_head == 0, f"n_embd={c.n_embd} is not divisible by n_head={c.n_head}"),
        (c.n_head % c.n_kv_head == 0, f"n_head={c.n_head} is not divisible by n_kv_head={c.n_kv_head}"),
        (hd % 2 == 0, f"head dim {hd} must be even for RoPE"),
        (0 <= c.lrt_gate_channels <= c.n_embd,
         f"lrt_gate_channels={c.lrt_gate_channels} must be in 0..n_embd={c.n_embd} (0 = all channels)"),
        (c.attn_window >= 0, f"attn_window={c.attn_window} must be >= 0 (0 = full causal attention)"),
        # a vocab_pad far past any real vocabulary only allocates rows that are never used (1e9: out of memory)
        (c.vocab_pad <= 4096, f"vocab_pad={c.vocab_pad} must be in 1..4096 (128 is the usual)"),
        # norm_eps <= 0 or rope_theta <= 0 make NaNs on the first step, which read as a diverged learning rate
        (c.norm_eps > 0, f"norm_eps={c.norm_eps} must be > 0"),
        (c.rope_theta > 0, f"rope_theta={c.rope_theta} must be > 0"),
        (0 <= c.rec_gate_gain < math.inf, f"rec_gate_gain={c.rec_gate_gain} must be >= 0 and finite (a xavier gain)"),
        (math.isfinite(c.rec_gate_init), f"rec_gate_init={c.rec_gate_init} must be finite (g_rec at init)"),
        (0.0 <= c.dropout < 1.0, f"dropout={c.dropout} must be in [0, 1)"),
        (0 < c.rec_scale_min <= c.rec_scale_max < math.inf,  # nan, inf: a state that is nan or never bounded
         f"rec_scale_min={c.rec_scale_min}, rec_scale_max={c.rec_scale_max}: need 0 < min <= max, finite"),
        (c.recurrence in ('none', 't2mlr', 'lrt'),
         f"unknown recurrence {c.recurrence!r}; expected 'none', 't2mlr' or 'lrt'"),
        (c.jacobi_init in ('plain', 'zero', 'exact'),
         f"unknown jacobi_init {c.jacobi_init!r}; expected 'plain' (the official code), 'zero' or 'exact'"),
        (c.lrt_inject in ('kv', 'residual', 'both'),
         f"unknown lrt_inject {c.lrt_inject!r}; expected 'kv', 'residual' or 'both'"),
        (c.reset_token is None or 0 <= c.reset_token < c.vocab_size,
         f"reset_token={c.reset_token} is not a token id (vocab_size={c.vocab_size})")]
    if c.recurrence != 'none':
        rules += [(0 <= s < L, f"rec_start={s} is out of range for n_layer={L} (layers are 0..{L-1})"),
                  (0 <= e < L, f"rec_end={e} is out of range for n_layer={L} (layers are 0..{L-1}, or -1 for the last)"),
                  (e >= s, f"rec_end={e} < rec_start={s}: the state must be read at or above the layer that receives it")]
    for ok, msg in rules:
        if not ok:
            raise ValueError(f"GPTConfig: {msg}")
    check_gpt_size(c)


def check_gpt_size(c):
    """check_fits for a GPTConfig (model.py's or lab/model_full.py's): its parameters, embedding (and head),
    attention, SwiGLU."""
    L, kv = c.n_layer, c.n_kv_head * (c.n_embd // c.n_head)
    n = c.padded_vocab * c.n_embd * (1 if c.tie_embeddings else 2) + L * c.n_embd * (2 * c.n_embd + 2 * kv + 3 * c.mlp_hidden)
    check_fits(f"GPTConfig: n_layer={L}, n_embd={c.n_embd}, mlp_hidden={c.mlp_hidden}, vocab_size={c.vocab_size}", n)


def check_fits(what, n_params):
    """A model whose float32 weights alone exceed the memory available now (--n_embd=65536) is a
    ValueError before it is built, not an allocator traceback. Under a GiB nothing is read."""
    need = 4 * n_params
    if need < 2**30:
        return
    try:
        with open('/proc/meminfo') as f:  # Linux; elsewhere the allocator has the last word
            free = next(int(line.split()[1]) * 1024 for line in f if line.startswith('MemAvailable:'))
    except (OSError, StopIteration, ValueError):
        return
    if need > free:
        raise ValueError(f"{what}: {n_params / 1e9:.1f}B parameters, {need / 2**30:,.0f} GiB of float32 weights alone, "
                         f"more than the {free / 2**30:,.0f} GiB of memory available")


def check_scheme(mode, n_iter=8, n_grad=4, n_subsets=2, n_rounds=1, T=None, block_len=1):
    """The one check of a forward mode and the training schemes' settings (train.py runs it at
    start-up, forward on every call). T: the sequence length, when known."""
    for ok, msg in [
            (mode in ('plain', 'exact', 'jacobi', 'interleaved', 'block', 'zero'),
             f"unknown mode {mode!r}; expected 'plain', 'exact', 'jacobi', 'interleaved', 'block' or 'zero'"),
            (block_len >= 1, f"block_len={block_len}: block training needs chunks of at least one token"),
            (n_iter >= 1, f"n_iter={n_iter}: Jacobi needs at least one iteration (n_iter >= 1)"),
            (0 <= n_grad <= n_iter, f"n_grad={n_grad}: the Jacobi iterations with gradient must be 0..n_iter={n_iter}"),
            (n_subsets >= 1 and not (mode == 'interleaved' and T is not None and n_subsets > T),
             f"n_subsets={n_subsets}: interleaved needs 1 <= n_subsets <= the sequence length {T}"),
            (n_rounds >= 1, f"n_rounds={n_rounds}: interleaved needs at least one round")]:
        if not ok:
            raise ValueError(msg)


def check_sampling(temperature, top_k):
    """temperature >= 0 (0 = greedy; a negative one samples the inverted distribution) and top_k
    None or an int >= 1 (0 or less is no filter at all, 2.5 a torch.topk error)."""
    if not temperature >= 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if top_k is not None and not (isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 1):
        raise ValueError(f"top_k={top_k!r} must be None (no top-k filter) or an int >= 1")


def check_generate(config, idx, max_new_tokens, temperature, top_k, prefill, prefill_iters, prefill_tol):
    """GPT.generate's arguments, for the prompts idx (B, T0): token ids of the vocabulary, at least one."""
    if idx.dim() != 2 or idx.size(0) < 1 or idx.size(1) < 1:
        raise ValueError(f"the prompts must be (B, T) token ids with B, T >= 1 (an empty prompt has no next token); "
                         f"got shape {tuple(idx.shape)}")
    if idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool:
        raise ValueError(f"the prompts must be integer token ids, not {idx.dtype}")
    if not 0 <= int(idx.min()) <= int(idx.max()) < config.vocab_size:  # an IndexError, or a device assert on CUDA
        raise ValueError(f"the prompts hold ids outside the vocabulary 0..{config.vocab_size - 1} "
                         f"(min {idx.min().item()}, max {idx.max().item()})")
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 0):
        raise ValueError(f"max_new_tokens={max_new_tokens!r} must be an int >= 0")
    T0 = idx.size(1)
    check_sampling(temperature, top_k)
    if prefill == 'jacobi' and not prefill_iters >= 1:  # 0 or less: a negative pass count, no prefill at all
        raise ValueError(f"prefill_iters={prefill_iters} must be >= 1")
    if prefill_tol is not None and not prefill_tol >= 0:
        raise ValueError(f"prefill_tol={prefill_tol} must be >= 0 (or None: prefill_iters passes)")
    if T0 + max_new_tokens > config.block_size:
        raise ValueError(f"prompt {T0} + {max_new_tokens} new tokens exceeds block_size {config.block_size}")


def check_decode_step(config, tok, pos, state, cache):
    """decode_step's inputs: one token per row, inside block_size, and a state and KV cache of the
    token's batch (a cache prefilled at another batch was silently reallocated as zeros). A position
    tensor is engine.py's compiled step, whose Engine.decode_step checked the range it came from."""
    if torch.is_tensor(pos):
        return
    state_batch = None if state is None else state.size(0)
    if tok.dim() != 2 or tok.size(1) != 1 or not isinstance(pos, range) or len(pos) != 1:
        raise ValueError(f"decode_step takes tok (B, 1) and pos = range(t, t + 1); got {tuple(tok.shape)}, {pos!r}")
    if pos.start >= config.block_size:
        raise ValueError(f"decode_step at position {pos.start}: past the model's block_size {config.block_size}")
    held = next((k.size(0) for k in getattr(cache, 'k', []) if k is not None), tok.size(0))
    if held != tok.size(0) or state_batch not in (None, tok.size(0)):
        raise ValueError(f"decode_step: {tok.size(0)} token rows, but the KV cache holds {held} and the state "
                         f"{state_batch}: prefill at the batch you decode")
