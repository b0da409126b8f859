"""The parallel training schemes (DESIGN.md 6 and 7) against the exact recurrence, float64."""

import pytest
import torch

from lab.model_full import GPT
from reference import full_model, naive_block, naive_exact, naive_interleaved
from test_model import STYLES, IDS, TOL, make, tokens

# both styles, each with middle and full spans, and the two cross pairings are covered
# because every scheme is run on every style below
SCHEME_STYLES = [STYLES[0], STYLES[1], STYLES[3], STYLES[4]]
SCHEME_IDS = ['t2mlr-mid', 't2mlr-full', 'lrt-shared', 'lrt-layerwise']


def doc_tokens(B=2, T=10):
    idx = tokens(B=B, T=T)
    idx[0, 4] = 0  # a document start inside the sequence
    return idx


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
@pytest.mark.parametrize('init', ['plain', 'zero'])
def test_jacobi_converges_to_exact(kw, init):
    # D = n_iter iterations (D+1 span passes). The initial pass is exact nowhere with
    # jacobi_init='plain' (it skips the fusion) and at position 0 with 'zero'; each
    # later pass makes one more position exact. So D makes the first D ('plain') or
    # D+1 ('zero') positions exact, and D >= T ('plain') / D >= T-1 ('zero') all of them.
    m = make(reset_token=0, jacobi_init=init, **kw)
    idx = doc_tokens()
    T = idx.size(1)
    exact = m(idx, mode='exact')[0]
    extra = 1 if init == 'zero' else 0
    for D in (T - extra, T + 3):
        torch.testing.assert_close(m(idx, mode='jacobi', n_iter=D, n_grad=1)[0], exact, **TOL)
    for k in (1, 3, 6):
        n = k + extra  # exactly the first n positions are exact
        approx = m(idx, mode='jacobi', n_iter=k, n_grad=1)[0]
        torch.testing.assert_close(approx[:, :n], exact[:, :n], **TOL)
        assert (approx[:, n:] - exact[:, n:]).abs().max() > 1e-6


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
def test_interleaved_full_stride_is_exact(kw):
    m = make(reset_token=0, **kw)
    idx = doc_tokens()
    torch.testing.assert_close(m(idx, mode='interleaved', n_subsets=idx.size(1))[0],
                               m(idx, mode='exact')[0], **TOL)


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
@pytest.mark.parametrize('S', [2, 3])
def test_interleaved_matches_naive_scheme(kw, S):
    m = make(reset_token=0, **kw)
    idx = doc_tokens()
    logits = m(idx, mode='interleaved', n_subsets=S)[0]
    torch.testing.assert_close(logits, naive_interleaved(m, idx, S), **TOL)
    # an approximation: it differs from the exact recurrence for S < T
    assert (logits - m(idx, mode='exact')[0]).abs().max() > 1e-6


@pytest.mark.parametrize('kw', [STYLES[3], STYLES[0]], ids=['lrt-shared', 't2mlr-mid'])
@pytest.mark.parametrize('S,R', [(2, 2), (1, 3), (3, 2)])
def test_interleaved_rounds_match_naive_scheme(kw, S, R):
    # R rounds of the S refinements: the naive scheme run R times over, and the exact
    # prefix grows with R: after the init pass position 0 is exact; each round extends
    # the prefix up to the next position of the last subset, so R*S positions are exact
    # (R+1 for S=1, the official full-sequence multi-refine), and the next one is not
    m = make(**kw)
    idx = tokens(B=2, T=10)
    logits = m(idx, mode='interleaved', n_subsets=S, n_rounds=R)[0]
    torch.testing.assert_close(logits, naive_interleaved(m, idx, S, rounds=R), **TOL)
    exact = m(idx, mode='exact')[0]
    n = max(R * S, R + 1)
    torch.testing.assert_close(logits[:, :n], exact[:, :n], **TOL)
    assert (logits[:, n] - exact[:, n]).abs().max() > 1e-6


def test_interleaved_rounds_loss_is_mean_of_passes():
    m = make(**STYLES[3])
    idx, tgt = tokens(), tokens(seed=7)
    _, loss = m(idx, tgt, mode='interleaved', n_subsets=2, n_rounds=3)
    from model import ce_loss
    # the 1 + R*S = 7 pass losses: the init pass (every layer on the zero state), then
    # round r's subset i, whose logits are what the scheme cut after r rounds shows at
    # the positions of subset i (no later pass of round r touches them)
    T = idx.size(1)
    x, zero = m.wte(idx), torch.zeros(idx.size(0), T, m.config.n_embd, dtype=m.wte.weight.dtype)
    init = m.run_blocks(x, 0, m.config.n_layer - 1, range(T), m.state_input(zero))
    parts = [ce_loss(m.lm_head(m.ln_f(init)), tgt)]
    for r in (1, 2, 3):
        logits = m(idx, mode='interleaved', n_subsets=2, n_rounds=r)[0]
        parts += [ce_loss(logits[:, i::2], tgt[:, i::2]) for i in (0, 1)]
    torch.testing.assert_close(loss, sum(parts) / 7, **TOL)


def test_interleaved_loss_is_mean_of_passes():
    m = make(**STYLES[0])
    idx, tgt = tokens(), tokens(seed=7)
    tgt[:, ::4] = -1  # some positions carry no loss
    _, loss = m(idx, tgt, mode='interleaved', n_subsets=2)
    from model import ce_loss
    T = idx.size(1)
    x = m.wte(idx)
    zero = m.run_blocks(x, 0, m.config.n_layer - 1, range(T), m.state_input(torch.zeros_like(x)))
    l0 = ce_loss(m.lm_head(m.ln_f(zero)), tgt)  # init pass = one pass of every layer with the zero state
    logits = m(idx, mode='interleaved', n_subsets=2)[0]
    l1, l2 = ce_loss(logits[:, 0::2], tgt[:, 0::2]), ce_loss(logits[:, 1::2], tgt[:, 1::2])
    torch.testing.assert_close(loss, (l0 + l1 + l2) / 3, **TOL)


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
def test_block_of_one_token_is_exact(kw):
    m = make(reset_token=0, **kw)
    idx = doc_tokens()
    torch.testing.assert_close(m(idx, mode='block', block_len=1)[0], naive_exact(m, idx), **TOL)


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
@pytest.mark.parametrize('C', [2, 3, 5])
def test_block_matches_naive_scheme(kw, C):
    m = make(reset_token=0, **kw)
    idx = doc_tokens(T=11)  # not a multiple of C: a shorter last chunk
    logits = m(idx, mode='block', block_len=C)[0]
    torch.testing.assert_close(logits, naive_block(m, idx, C), **TOL)
    # an approximation: it differs from the exact recurrence for C > 1
    assert (logits - m(idx, mode='exact')[0]).abs().max() > 1e-6


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
def test_block_of_the_whole_row_reads_zero(kw):
    # one chunk of T tokens: no position reads a state (lab/compare.py's ab6_lrt_nomem control), so
    # block training is the zero-state forward, and the modules without the memory remain
    m = make(reset_token=0, **kw)
    idx = doc_tokens()
    logits = m(idx, mode='block', block_len=idx.size(1))[0]
    torch.testing.assert_close(logits, naive_block(m, idx, idx.size(1)), **TOL)
    torch.testing.assert_close(logits, m(idx, mode='zero')[0], **TOL)
    assert (logits - m(idx, mode='exact')[0]).abs().max() > 1e-6


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3]], ids=['t2mlr', 'lrt'])
def test_block_gradients_match_naive_block(kw):
    # the state carries gradient across chunk boundaries, and so do the cached keys/values
    from model import ce_loss
    m = make(reset_token=0, **kw).train()
    idx, tgt = doc_tokens(T=8), tokens(B=2, T=8, seed=5)
    m.zero_grad()
    m(idx, tgt, mode='block', block_len=3)[1].backward()
    g_model = grads(m)
    m.zero_grad()
    ce_loss(naive_block(m, idx, 3, grad=True), tgt).backward()
    for n, g in grads(m).items():
        torch.testing.assert_close(g_model[n], g, rtol=0, atol=1e-10, msg=n)


def test_block_flops_hand_count():
    # the TINY model (test_model.py): 4 layers, d=32, 4 heads of 8, 2 KV heads, MLP 48, vocab 23
    from support.flops import flops_per_token
    c, T = make(**STYLES[0]).config, 11
    layer = 2 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 48) + 4 * 4 * 8 * T  # q, k+v, o, MLP; QK^T and AV
    head = 2 * 32 * 23
    fusion = 2 * (32 * 32 + 2 * 64 * 32)  # W_rec, f_cur, f_rec
    fwd = 4 * layer + head + fusion  # every layer once per token, whatever the chunk length
    for C in (1, 3, 11):
        assert flops_per_token(c, T, 'block', block_len=C, train=False) == fwd
        assert flops_per_token(c, T, 'block', block_len=C) == 3 * fwd == flops_per_token(c, T, 'exact')


def test_jacobi_exact_init_flops_hand_count():
    # jacobi_init='exact': the exact loop (every layer once, no head), then the span B+1 times with the
    # layers outside it and the head, forward; backward over the B+1 span passes with gradient
    from support.flops import flops_per_token
    c, T = make(jacobi_init='exact', **STYLES[0]).config, 11   # span 1..2 of 0..3
    layer = 2 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 48) + 4 * 4 * 8 * T
    head, fusion = 2 * 32 * 23, 2 * (32 * 32 + 2 * 64 * 32)
    for B in (0, 1, 3):
        passes = 2 + (B + 1) * 2  # below and above once, the span B+1 times
        fwd = (4 * layer + fusion) + passes * layer + head + (B + 1) * fusion
        bwd = passes * layer + head + (B + 1) * fusion
        assert flops_per_token(c, T, 'jacobi', n_iter=8, n_grad=B) == fwd + 2 * bwd


def grads(model):
    return {n: (p.grad.clone() if p.grad is not None else None) for n, p in model.named_parameters()}


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
@pytest.mark.parametrize('mode', ['jacobi', 'interleaved', 'block'])
def test_gradients_reach_every_parameter(kw, mode):
    m = make(**kw).train()
    idx, tgt = tokens(), tokens(seed=3)
    _, loss = m(idx, tgt, mode=mode, n_iter=4, n_grad=2, n_subsets=2, block_len=3)
    loss.backward()
    for n, p in m.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, n


def official_jacobi(model, idx, D, B, rec_mask=None):
    """The official T2MLR batch-forward approximation (princeton-pli/T2MLR,
    t2mlr_wrapper.py, batch_approximate_forward), written out naively, one sequence at
    a time, from its description in docs/DESIGN.md 6: an initial pass (the plain model,
    or the zero state), D-1 iterations over the whole model, a final pass. Logits (B, T, V)."""
    c = model.config
    dt = model.wte.weight.dtype
    out = []
    for b, ids in enumerate(idx):
        T = ids.numel()
        on = torch.ones(T, dtype=torch.bool) if rec_mask is None else rec_mask[b]
        starts = torch.tensor([t == 0 or (c.reset_token is not None and ids[t].item() == c.reset_token)
                               for t in range(T)])

        def read(cache):  # shift right; zero at t = 0, at document starts and at plain positions
            S = torch.cat([torch.zeros(1, c.n_embd, dtype=dt), cache[:-1]])
            return torch.where((starts | ~on)[:, None], torch.zeros_like(S), S)

        def handoff(h, S):  # the cache a pass leaves: raw h where the token ran plain (T2MLR)
            if c.recurrence == 'lrt':
                return h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + c.norm_eps)
            R = S.detach() if c.rec_residual_detach else S
            mm = h + R if c.rec_residual else h
            scale = (1 / torch.sqrt(mm.detach().pow(2).mean(-1, keepdim=True) + 1e-6)).clamp(0.2, 5.0)
            return torch.where(on[:, None], mm * scale, h)

        zero = torch.zeros(T, c.n_embd, dtype=dt)
        if c.jacobi_init == 'plain':  # the plain model: no fusion anywhere; its raw h^(e) is the cache
            _, h = full_model(model, ids, zero, torch.zeros(T, dtype=torch.bool))
            cache = h if c.recurrence == 't2mlr' else handoff(h, zero)
        else:
            _, h = full_model(model, ids, zero, on)
            cache = handoff(h, zero)
        if B < D:
            cache = cache.detach()
        S = read(cache)
        for d in range(D - 1):
            _, h = full_model(model, ids, S, on)
            cache = handoff(h, S)
            if D - 1 - d > B:  # remaining steps > B: no gradient
                cache = cache.detach()
            S = read(cache)
        logits, _ = full_model(model, ids, S, on)
        out.append(logits)
    return torch.stack(out)


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3]], ids=['t2mlr', 'lrt'])
@pytest.mark.parametrize('init', ['plain', 'zero'])
@pytest.mark.parametrize('detach', [False, True], ids=['res', 'res_detached'])
@pytest.mark.parametrize('B', [0, 1, 3])
def test_jacobi_is_the_official_schedule(kw, init, detach, B):
    # forward(mode='jacobi') gives the official code's loss and gradients, with a prompt
    # (rec_mask) in two rows and document resets; D = 4, B in {0, 1, D-1}
    from model import ce_loss
    if detach and kw['recurrence'] == 'lrt':
        pytest.skip('rec_residual_detach is a T2MLR option (LRT has no residual in its state)')
    m = make(reset_token=0, jacobi_init=init, rec_residual_detach=detach, **kw).train()
    idx, tgt = doc_tokens(B=3, T=9), tokens(B=3, T=9, seed=3)
    mask = torch.ones_like(idx, dtype=torch.bool)
    mask[0, :3] = False
    mask[1, :5] = False
    D = 4
    m.zero_grad()
    loss = m(idx, tgt, mode='jacobi', n_iter=D, n_grad=B, rec_mask=mask)[1]
    loss.backward()
    g_model = grads(m)
    m.zero_grad()
    ref = ce_loss(official_jacobi(m, idx, D, B, mask), tgt)
    ref.backward()
    torch.testing.assert_close(loss, ref, **TOL)
    for n, g in grads(m).items():
        if g is None:
            assert g_model[n] is None or g_model[n].abs().max() == 0, n
        else:
            torch.testing.assert_close(g_model[n], g, rtol=0, atol=1e-10, msg=n)


def jacobi_against(m, D_ref, B, **kw):
    """forward(mode='jacobi', **kw)'s loss and gradients against the official schedule's at depth
    D_ref with B, both with a prompt (rec_mask) in two rows and document resets."""
    from model import ce_loss
    idx, tgt = doc_tokens(B=3, T=9), tokens(B=3, T=9, seed=3)
    mask = torch.ones_like(idx, dtype=torch.bool)
    mask[0, :3] = False
    mask[1, :5] = False
    m.zero_grad()
    loss = m(idx, tgt, mode='jacobi', n_grad=B, rec_mask=mask, **kw)[1]
    loss.backward()
    g_model = grads(m)
    m.zero_grad()
    init = m.config.jacobi_init
    m.config.jacobi_init = 'plain' if init == 'exact' else init  # the reference's own first guess
    ref = ce_loss(official_jacobi(m, idx, D_ref, B, mask), tgt)
    m.config.jacobi_init = init
    ref.backward()
    torch.testing.assert_close(loss, ref, **TOL)
    for n, g in grads(m).items():
        if g is None:
            assert g_model[n] is None or g_model[n].abs().max() == 0, n
        else:
            torch.testing.assert_close(g_model[n], g, rtol=0, atol=1e-10, msg=n)


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
@pytest.mark.parametrize('B', [0, 1, 2])
def test_jacobi_exact_init_is_jacobi_at_full_depth(kw, B):
    # jacobi_init='exact' starts from the exact recurrence's states, the fixed point: its loss and
    # gradients are the official schedule's at D = T (exact everywhere, 'plain' init), whatever n_iter
    m = make(reset_token=0, jacobi_init='exact', **kw).train()
    for D in (B + 1, 5):
        jacobi_against(m, 9, B, n_iter=D)


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3]], ids=['t2mlr', 'lrt'])
def test_jacobi_gradient_depth_matters(kw):
    # backpropagating through every pass (B = D) gives other gradients than B = 1,
    # and rec_residual_detach changes T2MLR's gradients but not its values
    m = make(**kw).train()
    idx, tgt = tokens(), tokens(seed=3)
    name = 'fusion.g_rec' if kw['recurrence'] == 't2mlr' else 'lrt.w_fb.0.weight'
    g = {}
    for B in (1, 5):
        m.zero_grad()
        m(idx, tgt, mode='jacobi', n_iter=5, n_grad=B)[1].backward()
        g[B] = m.get_parameter(name).grad.clone()
    assert (g[5] - g[1]).abs().max() > 1e-8
    if kw['recurrence'] == 't2mlr':
        l0 = m(idx, tgt, mode='jacobi', n_iter=5, n_grad=5)[1]
        m.config.rec_residual_detach = True
        m.zero_grad()
        l1 = m(idx, tgt, mode='jacobi', n_iter=5, n_grad=5)[1]
        l1.backward()
        assert l0.item() == l1.item()
        assert (m.get_parameter(name).grad - g[5]).abs().max() > 1e-8


def test_jacobi_no_grad_iterations_build_no_graph():
    # the number of autograd nodes does not grow with D when B is fixed
    m = make(**STYLES[0]).train()
    idx, tgt = tokens(), tokens(seed=3)

    def n_nodes(loss):
        seen, stack = set(), [loss.grad_fn]
        while stack:
            f = stack.pop()
            if f is None or f in seen:
                continue
            seen.add(f)
            stack.extend(g for g, _ in f.next_functions)
        return len(seen)

    a = n_nodes(m(idx, tgt, mode='jacobi', n_iter=3, n_grad=2)[1])
    b = n_nodes(m(idx, tgt, mode='jacobi', n_iter=9, n_grad=2)[1])
    c = n_nodes(m(idx, tgt, mode='jacobi', n_iter=9, n_grad=3)[1])
    assert a == b < c


def test_bad_scheme_arguments():
    m = make(**STYLES[0])
    with pytest.raises(ValueError, match='n_grad'):
        m(tokens(), mode='jacobi', n_iter=2, n_grad=3)
    with pytest.raises(ValueError, match='n_subsets'):
        m(tokens(T=5), mode='interleaved', n_subsets=6)
    with pytest.raises(ValueError, match='block_len'):
        m(tokens(), mode='block', block_len=0)


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
def test_full_unroll_gradients_match_naive_exact(kw):
    # Jacobi with D = B = T backpropagates through the exact recurrence: its
    # gradients must be those of the naive token-by-token reference
    from model import ce_loss
    from reference import naive_exact
    m = make(reset_token=0, **kw).train()
    idx, tgt = doc_tokens(T=7), tokens(B=2, T=7, seed=5)
    m.zero_grad()
    m(idx, tgt, mode='jacobi', n_iter=7, n_grad=7)[1].backward()
    g_model = grads(m)
    m.zero_grad()
    ce_loss(naive_exact(m, idx, grad=True), tgt).backward()
    for n, g in grads(m).items():
        torch.testing.assert_close(g_model[n], g, rtol=0, atol=1e-10, msg=n)


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
def test_interleaved_full_stride_loss_with_the_init_pass(kw):
    # the loss is the mean of the pass losses: the init pass (zero memory, as mode 'zero') and,
    # with S = T, one refinement per position, whose mean is the exact recurrence's loss; its
    # gradient is the same mix of mode 'zero''s and the naive reference's
    from model import ce_loss
    from reference import naive_exact
    m = make(reset_token=0, **kw).train()
    idx, tgt = doc_tokens(T=7), tokens(B=2, T=7, seed=5)
    T = idx.size(1)
    exact, zero = m(idx, tgt, mode='exact')[1], m(idx, tgt, mode='zero')[1]
    torch.testing.assert_close(m(idx, tgt, mode='interleaved', n_subsets=T)[1], (zero + T * exact) / (T + 1), **TOL)
    m.zero_grad()
    loss = m(idx, tgt, mode='interleaved', n_subsets=T)[1]
    loss.backward()
    g_model = grads(m)
    m.zero_grad()
    ref = (m(idx, tgt, mode='zero')[1] + T * ce_loss(naive_exact(m, idx, grad=True), tgt)) / (T + 1)
    ref.backward()
    torch.testing.assert_close(loss, ref, **TOL)
    for n, g in grads(m).items():
        torch.testing.assert_close(g_model[n], g, rtol=0, atol=1e-10, msg=n)


@pytest.mark.parametrize('kw', SCHEME_STYLES, ids=SCHEME_IDS)
def test_rec_mask_prompt_runs_plain(kw):
    # T2MLR fine-tuning: prompt positions run as the plain model, response positions
    # carry the state. Every scheme honours the mask and agrees with the reference.
    from reference import naive_exact
    m = make(reset_token=0, **kw)
    idx = doc_tokens()
    mask = torch.ones_like(idx, dtype=torch.bool)
    mask[0, :4] = False  # a 4-token prompt in row 0
    mask[1, :6] = False  # a 6-token prompt in row 1
    exact = m(idx, mode='exact', rec_mask=mask)[0]
    torch.testing.assert_close(exact, naive_exact(m, idx, rec_mask=mask), **TOL)
    plain = m(idx, mode='plain')[0]
    torch.testing.assert_close(exact[0, :4], plain[0, :4], **TOL)  # the prompt is untouched
    torch.testing.assert_close(exact[1, :6], plain[1, :6], **TOL)
    assert (exact[:, 7:] - plain[:, 7:]).abs().max() > 1e-3  # the response is not
    T = idx.size(1)
    torch.testing.assert_close(m(idx, mode='jacobi', n_iter=T, n_grad=1, rec_mask=mask)[0], exact, **TOL)
    torch.testing.assert_close(m(idx, mode='interleaved', n_subsets=T, rec_mask=mask)[0], exact, **TOL)
    torch.testing.assert_close(m(idx, mode='block', block_len=1, rec_mask=mask)[0], exact, **TOL)
    torch.testing.assert_close(m(idx, mode='block', block_len=3, rec_mask=mask)[0], naive_block(m, idx, 3, mask), **TOL)
    # generation: plain prefill of the prompt, then the state, equals the masked exact model
    prompt = idx[:1, :4]
    out, logits = m.generate(prompt, 6, temperature=0, prefill='plain', return_logits=True)
    pm = torch.ones_like(out, dtype=torch.bool)
    pm[:, :4] = False
    torch.testing.assert_close(logits, m(out, mode='exact', rec_mask=pm)[0][:, :-1], **TOL)


@pytest.mark.parametrize('kw', [STYLES[0], STYLES[3], dict(recurrence='none')], ids=['t2mlr', 'lrt', 'plain'])
def test_attention_window_everywhere(kw):
    # a sliding attention window (attn_window=3 < T) is honoured by every path
    from reference import naive_exact, naive_interleaved
    m = make(reset_token=0, attn_window=3, **kw)
    idx = doc_tokens()
    T = idx.size(1)
    exact = m(idx, mode='exact')[0]
    torch.testing.assert_close(exact, naive_exact(m, idx), **TOL)
    out, logits = m.generate(idx[:, :5], 6, temperature=0, return_logits=True)
    torch.testing.assert_close(logits, m(out, mode='exact')[0][:, :-1], **TOL)
    if kw['recurrence'] != 'none':
        torch.testing.assert_close(m(idx, mode='jacobi', n_iter=T, n_grad=1)[0], exact, **TOL)
        torch.testing.assert_close(m(idx, mode='interleaved', n_subsets=2)[0], naive_interleaved(m, idx, 2), **TOL)
    # and the window changes the model (it is not silently ignored)
    m.config.attn_window = 0
    assert (m(idx, mode='exact')[0] - exact).abs().max() > 1e-4


@pytest.mark.parametrize('kw', [STYLES[1], STYLES[3]], ids=['t2mlr', 'lrt'])
def test_nope_everywhere(kw):
    # rope=False (NoPE) is honoured by every path: the naive reference without rotation
    from reference import naive_exact, naive_interleaved
    m = make(reset_token=0, rope=False, **kw)
    idx = doc_tokens()
    exact = m(idx, mode='exact')[0]
    torch.testing.assert_close(exact, naive_exact(m, idx), **TOL)
    out, logits = m.generate(idx[:, :5], 6, temperature=0, return_logits=True)
    torch.testing.assert_close(logits, m(out, mode='exact')[0][:, :-1], **TOL)
    torch.testing.assert_close(m(idx, mode='jacobi', n_iter=idx.size(1), n_grad=1)[0], exact, **TOL)
    torch.testing.assert_close(m(idx, mode='interleaved', n_subsets=2)[0], naive_interleaved(m, idx, 2), **TOL)
    # and positions no longer enter attention: the same model with RoPE differs
    m2 = make(reset_token=0, **kw)
    assert (m2(idx, mode='exact')[0] - exact).abs().max() > 1e-4
