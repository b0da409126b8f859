"""lab/official.py against the official code, at a small size (docs/peers.md). Runs when
T2MLR_REPO and LRT_REPO point at local checkouts of princeton-pli/T2MLR and
OoDBag/Latent_recurrent_transformer, is skipped otherwise:

  T2MLR_REPO=/path/T2MLR LRT_REPO=/path/Latent_recurrent_transformer python -m pytest tests/test_official.py

The T2MLR agreement is asserted with tight tolerances, the greedy tokens too (under transformers
>= 5.24 with the tool's workaround 5). Timings (noisy on a shared machine) are only checked for
presence.

The tests at the end always run: our side of the tool (the weight mapping, the decode loops it
drives, its report) with our own model in the official code's place, so that a change to
model.py's interface cannot break the tool unseen while the checkout tests are skipped (once,
decode_step took a range and the tool still passed it an int)."""

import copy
import importlib.util
import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lab.model_full import GPT, GPTConfig, KVCache
from support.checkpoint import HF_LLAMA_NAMES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, 'lab', 'official.py')
REPOS = [os.environ.get('T2MLR_REPO', ''), os.environ.get('LRT_REPO', '')]
needs_repos = pytest.mark.skipif(not all(REPOS), reason="T2MLR_REPO and LRT_REPO are not set (local checkouts "
                                 "of princeton-pli/T2MLR and OoDBag/Latent_recurrent_transformer)")
SMALL = ['--n_layer=4', '--n_embd=64', '--n_head=4', '--t2mlr_start=1', '--t2mlr_end=2', '--n_iter=4', '--n_grad=2',
         '--batch_size=2', '--seq_len=32', '--prompt_len=8', '--gen_len=16', '--reps=1']
GEN = 16


def tool(*args, **env):
    return subprocess.run([sys.executable, TOOL, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, 'OMP_NUM_THREADS': '1', **env})


@pytest.fixture(scope='module')
def small():
    p = tool(*SMALL)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stdout


@needs_repos
def test_t2mlr_loss_gradients_exact_decode_agree(small):
    a = small[0]['t2mlr']['agreement']
    assert a['n_grads'] == 4 * 6 + 2 + 7  # every parameter: 6 a block, wte (lm_head tied), ln_f, the fusion's 7
    assert a['jacobi_loss_diff'] <= 1e-6 * a['jacobi_loss_ours']  # float32 precision
    assert a['max_rel_grad_diff'] < 1e-4, a['worst_param']
    assert a['exact_loss_diff'] <= 1e-6 * a['exact_loss_ours']
    assert a['decode_logits_diff'] < 1e-5
    # not vacuous: the recurrence moves the exact loss by far more than the tolerance
    assert a['recurrence_effect'] > 100 * 1e-6 * a['exact_loss_ours']


@needs_repos
def test_t2mlr_greedy_tokens_equal(small):
    res, stdout = small
    a = res['t2mlr']['agreement']
    # every token after the first read the state (transformers >= 5.24: only with the cache handed on)
    assert a['generate_mixer_calls'] == GEN - 1 and a['tokens_equal'] is True
    assert ('workaround 5' in stdout) == res['env']['generate_cache_renamed'] and 'NOT COMPARED' not in stdout


@needs_repos
def test_official_trainer_call(small):
    """The official Jacobi forward as its trainer calls it (use_cache unset) agrees too, except under
    transformers >= 5.24, where its KV cache leaks into the iterations; then the report says so."""
    res, stdout = small
    a = res['t2mlr']['agreement']
    if a['default_cache_max_rel_grad_diff'] >= 1e-4:
        assert res['env']['generate_cache_renamed'] and 'stale keys' in stdout
    else:
        assert a['default_cache_loss_diff'] <= 1e-6 * a['jacobi_loss_ours']


@needs_repos
def test_timings_present(small):
    res = small[0]
    assert res['env']['threads'] == 1
    for m in ('t2mlr', 'lrt'):
        for key in ('train_step', 'decode_per_token', 'exact_eval', 'train_memory'):
            r = res[m]['timing'][key]
            assert math.isfinite(r['ratio']) and r['ratio'] > 0, (m, key, r)


def test_missing_checkout_is_one_line():
    for args, env, says in ((['--t2mlr_repo=/nonexistent', '--lrt_repo=/nonexistent'], {}, 'no src/t2mlr_wrapper'),
                            (['--lrt_repo=/nonexistent'], {'T2MLR_REPO': ''}, 't2mlr_repo is not set')):
        p = tool(*args, **env)
        assert p.returncode == 2 and p.stdout == '', p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and says in p.stderr

# -----------------------------------------------------------------------------
# always run: our side of the tool, our own model as the peer


def load_tool():
    spec = importlib.util.spec_from_file_location('official', TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # no settings read, nothing official imported: that is main()'s
    return mod


def t2mlr_model():
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=32, vocab_size=40, n_layer=3, n_head=2, n_kv_head=1, n_embd=16, recurrence='t2mlr',
                      rec_start=1, rec_end=1)).eval()
    with torch.no_grad():  # gates open, as the tool's: a closed recurrence would compare two plain models
        m.fusion.g_cur.fill_(0.5)
        m.fusion.g_rec.fill_(1.0)
    return m


def llama_params(m):
    """Our model's backbone weights under the Llama names (what to_hf_llama gives the tool, without
    transformers): the fused matrices split by rows, fresh parameters."""
    c, sd, out = m.config, m.state_dict(), {}
    hd = c.n_embd // c.n_head
    rows = dict(q_proj=c.n_head * hd, k_proj=c.n_kv_head * hd, v_proj=c.n_kv_head * hd, gate_proj=c.mlp_hidden,
                up_proj=c.mlp_hidden)
    for k_ours, k_hf in HF_LLAMA_NAMES.items():
        if k_ours == 'lm_head.weight' and c.tie_embeddings:
            continue
        for i in (range(c.n_layer) if '{i}' in k_ours else [None]):
            keys = [k.format(i=i) for k in ((k_hf,) if isinstance(k_hf, str) else k_hf)]
            w = sd[k_ours.format(i=i)]
            parts = w.split([rows[k.split('.')[-2]] for k in keys]) if len(keys) > 1 else [w]
            out.update({k: torch.nn.Parameter(p.clone()) for k, p in zip(keys, parts)})
    return out


def mixer_like(tool, m):
    """A module with the official gated mixer's parameter names, zeros of our fusion's shapes."""
    mixer, ours = torch.nn.Module(), dict(m.named_parameters())
    for k_ours, k_mix in tool.MIXER_NAMES.items():
        sub, _, name = k_mix.rpartition('.')
        if sub and not hasattr(mixer, sub):
            mixer.add_module(sub, torch.nn.Module())
        (getattr(mixer, sub) if sub else mixer).register_parameter(
            name, torch.nn.Parameter(torch.zeros_like(ours['fusion.' + k_ours])))
    return mixer


class OurPeer(torch.nn.Module):
    """Our own GPT behind the official T2MLRWrapper's per-token interface, the one theirs_decode
    drives: control flow 1 the prompt (plain), 2 one recurrent token; the cache handed back."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, control_flows, use_cache, past_key_values=None):
        m = self.model
        assert use_cache and self._force_simple_recurrent and self.auto_control_flow_generation
        if past_key_values is None:
            assert (control_flows == 1).all()
            cache = KVCache(m.config.n_layer, m.config.block_size)
            logits, state, _ = m.prefill(input_ids, cache, 'plain')
            return SimpleNamespace(logits=logits, past_key_values=(cache, state, input_ids.size(1)))
        assert (control_flows == 2).all()
        cache, state, t = past_key_values
        logits, state = m.decode_step(input_ids, range(t, t + 1), state, cache)
        return SimpleNamespace(logits=logits, past_key_values=(cache, state, t + 1))


def test_ours_weight_mapping():
    tool, m = load_tool(), t2mlr_model()
    hf, mixer = llama_params(m), mixer_like(tool, m)
    pairs = tool.map_t2mlr(m, hf, mixer)
    ours = dict(m.named_parameters())
    assert set(pairs) == set(ours) and len(pairs) == 3 * 6 + 2 + 7  # 6 a block, wte (tied head), ln_f, the fusion's 7
    for k, ps in pairs.items():  # each of ours is its peers stacked by rows; the fusion's copied into the mixer
        assert torch.equal(torch.cat([p.detach().flatten() for p in ps]), ours[k].detach().flatten()), k
    mixer.extra = torch.nn.Parameter(torch.zeros(3))  # a peer parameter nobody maps
    with pytest.raises(AssertionError, match='official parameters with no counterpart of ours'):
        tool.map_t2mlr(m, hf, mixer)
    del hf['model.layers.2.mlp.down_proj.weight']
    with pytest.raises(AssertionError, match=r'parameters of ours with no official counterpart.*h\.2\.mlp\.w_down'):
        tool.map_t2mlr(m, hf, mixer_like(tool, m))


def test_ours_decode_loops_and_report(capsys):
    tool, m = load_tool(), t2mlr_model()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, 40, (1, 5), generator=g)
    toks = [t.view(1, 1) for t in torch.randint(0, 40, (8,), generator=g)]
    with torch.no_grad():
        dt_o, lo = tool.ours_decode(m, prompt, toks)
        dt_t, lt = tool.theirs_decode(OurPeer(copy.deepcopy(m)), prompt, toks)
        for other in ('lrt', 'none'):  # the LRT side's decode loop, and a plain model's
            torch.manual_seed(0)
            o = GPT(GPTConfig(block_size=32, vocab_size=40, n_layer=2, n_head=2, n_kv_head=2, n_embd=16,
                              recurrence=other)).eval()
            assert tool.ours_decode(o, prompt, toks)[1].shape == (1, 1, 40)
    assert lo.shape == (1, 1, 40) and dt_o > 0 and dt_t > 0
    assert (lo - lt).abs().max().item() < 1e-6  # the same model both ways: the loops agree
    with torch.no_grad():  # not vacuous: the recurrence moves the decode logits
        assert (lo - tool.ours_decode(GPT(m.config).eval(), prompt, toks)[1]).abs().max().item() > 1e-3
    # the report, from figures of the loops above
    tool.reps = 1
    timing = dict(train_step=dict(ours_ms=2.0, theirs_ms=4.0, ratio=0.5),
                  decode_per_token=tool.compare(lambda: tool.ours_decode(m, prompt, toks)[0],
                                                lambda: tool.theirs_decode(OurPeer(m), prompt, toks)[0]),
                  exact_eval=dict(ours_ms=1.0, theirs_ms=1.0, ratio=1.0),
                  train_memory=dict(ours_mib=3.0, theirs_mib=4.0, ratio=0.75))
    agree = dict(n_params=sum(p.numel() for p in m.parameters()), jacobi_loss_ours=1.0, jacobi_loss_theirs=1.0,
                 jacobi_loss_diff=0.0, max_rel_grad_diff=1e-5, worst_param='fusion.g_rec', n_grads=27,
                 default_cache_loss_diff=0.0, default_cache_max_rel_grad_diff=0.0, exact_loss_ours=1.0,
                 exact_loss_theirs=1.0, exact_loss_diff=0.0, recurrence_effect=1e-2,
                 decode_logits_diff=(lo - lt).abs().max().item(), generate_mixer_calls=7, tokens_equal=True)
    config = dict(n_iter=4, n_grad=2, batch_size=2, seq_len=16, gen_len=8, n_subsets=2, reps=1)
    env = dict(transformers='5.24.0', generate_cache_renamed=True)
    results = dict(config=config, env=env, t2mlr=dict(agreement=agree, timing=timing),
                   lrt=dict(n_params_ours=10, n_params_theirs=12, timing=timing))
    tool.report(results)
    out = capsys.readouterr().out
    assert 'greedy tokens    8: equal (official mixer ran 7 times, the cache handed on' in out
    assert 'training memory            0.75 (3.0/4.0 MiB)' in out and ' MB' not in out
    assert out.count('decode per token') == 1 and math.isfinite(timing['decode_per_token']['ratio'])
    agree.update(generate_mixer_calls=0, tokens_equal=None)  # the official generate ran without its recurrence
    tool.report(results)
    out = capsys.readouterr().out
    assert 'greedy tokens    NOT COMPARED' in out and "its tokens are a plain model's" in out and '5.23' in out
    json.dumps(results)  # main() prints it as the last line


def test_official_bad_shape_is_one_line(tmp_path):
    for d in ('src/t2mlr_wrapper', 'nanochat/gpt.py'):
        os.makedirs(tmp_path / d)  # the checkout marks, so that the shape is what is checked
    p = tool(f'--t2mlr_repo={tmp_path}', f'--lrt_repo={tmp_path}', '--n_head=3')
    assert p.returncode == 2 and p.stdout == '' and p.stderr.strip().splitlines() == [
        'error: GPTConfig: n_embd=256 is not divisible by n_head=3'], p.stderr
