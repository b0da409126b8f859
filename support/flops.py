"""
FLOPs per token of one training step (or one forward), counting every extra pass a scheme
makes: the cost model of docs/DESIGN.md 6 and 7. train.py reports MFU with it, bench.py sets
its predicted ratios next to the measured ones, lab/compare.py gives the plain model the extra
steps its cheaper step buys at equal compute. 2 FLOPs per multiply-accumulate.
"""


def layer_flops(c, T):
    """Forward FLOPs per token of one block, attention over a context of T."""
    hd = c.n_embd // c.n_head
    dkv = c.n_kv_head * hd
    mats = c.n_embd * (2 * c.n_embd + 2 * dkv) + 3 * c.n_embd * c.mlp_hidden
    attn = 4 * c.n_head * hd * T  # QK^T and AV over T keys (nanoGPT's convention, no causal halving)
    return 2 * mats + attn


def rec_flops(c):
    """Forward FLOPs per token the recurrence adds (T2MLR's fusion, or LRT's projections and gates)."""
    d, dkv = c.n_embd, c.n_kv_head * (c.n_embd // c.n_head)
    if c.recurrence == 't2mlr':
        return 2 * ((d * d if getattr(c, 'rec_proj', True) else 0) + 2 * (2 * d) * d)  # W_rec + f_cur + f_rec
    if c.recurrence == 'lrt' and getattr(c, 'lrt_inject', 'both') != 'residual':  # (model.py's: always both)
        n_read = c.n_layer - c.rec_start
        gate_in = getattr(c, 'lrt_gate_channels', 0) or d
        return 2 * 2 * d * dkv * (1 if c.lrt_shared else n_read) + 2 * gate_in * 2 * c.n_kv_head * n_read  # W_fb, W_g
    return 0


def lstm_flops(c):
    """Forward FLOPs per token of lstm.LSTM (c: an LSTMConfig): per layer the four gates, (H + H) -> H
    each, then the LM head."""
    return c.n_layer * 2 * 4 * (2 * c.n_embd) * c.n_embd + 2 * c.n_embd * c.padded_vocab


def flops_per_token(c, T, mode='plain', n_iter=8, n_grad=4, n_subsets=2, train=True, n_rounds=None, block_len=1):
    """c: a GPTConfig (model.py's or lab/model_full.py's) or an LSTMConfig. FLOPs per token of one step over
    sequences of T tokens: the forward, plus with train the backward at 2x the forward of every pass that
    carries gradient. n_rounds: None = the config's (lab/model_full.py's; 1 else). (block_len: taken so that
    a scheme dict passes whole; block training's cost does not depend on it.)"""
    n_rounds = getattr(c, 'n_rounds', 1) if n_rounds is None else n_rounds
    if getattr(c, 'arch', 'gpt') == 'lstm':  # the baseline: one forward, whatever the mode
        return lstm_flops(c) * (3 if train else 1)
    L, lf, hf = c.n_layer, layer_flops(c, T), 2 * c.n_embd * c.padded_vocab
    if c.recurrence == 'none' or mode == 'plain':
        fwd = bwd = L * lf + hf
    else:
        s, e = c.rec_start, c.rec_end
        below, span, above, rec = s, e - s + 1, L - 1 - e, rec_flops(c)
        if mode in ('exact', 'zero', 'block'):
            # every layer once per token; block training's chunks of block_len attend over at
            # most T keys, counted as T (the convention above), so it costs what exact costs
            fwd = bwd = L * lf + hf + rec
        elif mode == 'jacobi':
            # D+1 span passes, B+1 of them with gradient; a 'plain' initial pass fuses nothing
            plain = c.jacobi_init == 'plain'
            fwd = (below + (n_iter + 1) * span + above) * lf + hf + (n_iter + 1 - plain) * rec
            if c.jacobi_init == 'exact':  # the exact loop without the head, then B iterations and the final pass
                fwd = L * lf + rec + (below + (n_grad + 1) * span + above) * lf + hf + (n_grad + 1) * rec
            bwd = (below + (n_grad + 1) * span + above) * lf + hf + (n_grad + 1 - (plain and n_grad == n_iter)) * rec
        elif mode == 'interleaved':
            # init pass over everything, then R rounds of S subsets of T/S tokens through blocks s..L-1
            fwd = bwd = (below + (1 + n_rounds) * (span + above)) * lf + (1 + n_rounds) * (hf + rec)
        else:
            raise ValueError(f"unknown mode {mode!r}")
    return fwd + (2 * bwd if train else 0)
