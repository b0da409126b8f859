"""bench.py end to end, in --quick mode, through a subprocess: the last stdout line is
one JSON object holding every figure. Timings are never compared with thresholds
(the machine may be loaded): only presence, sign and finiteness are checked."""

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
try:
    import matplotlib  # noqa: F401
    HAVE_MPL = True
except ImportError:
    HAVE_MPL = False


def bench(*args, cwd=ROOT):
    return subprocess.run([sys.executable, os.path.join(ROOT, 'bench.py'), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def finite_pos(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('bench')
    out = tmp / 'bench.json'
    # a trained-model stand-in for the prefill section, and a small training config for the memory one
    import dataclasses
    import torch
    from checkpoint import save_checkpoint
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    m = GPT(GPTConfig(block_size=24, vocab_size=3, n_layer=2, n_head=2, n_kv_head=1, n_embd=16, recurrence='t2mlr',
                      rec_start=0, rec_end=1))
    save_checkpoint({'model': m.state_dict(), 'model_args': dataclasses.asdict(m.config)}, str(tmp / 'ckpt.pt'))
    (tmp / 'mem.py').write_text("n_layer = 2\nn_embd = 32\nn_head = 4\nn_kv_head = 2\nblock_size = 64\nbatch_size = 8\n"
                                "recurrence = 'lrt'\ntrain_mode = 'interleaved'\nn_subsets = 2\n")
    (tmp / 'mem_rc.py').write_text((tmp / 'mem.py').read_text() + "recompute = True\n")
    # compiled decode and prefill too, with dynamo's 'eager' backend: the same tracing, the
    # same static shapes and rows, without minutes of inductor code generation
    args = ['--quick=True', '--threads=1', f'--out={out}', '--compile=True', '--compile_backend=eager',
            '--decode_batches=1', f'--prefill_ckpt={tmp}/ckpt.pt', f'--mem_configs={tmp}/mem.py,{tmp}/mem_rc.py',
            '--mem_vocab=100']
    if HAVE_MPL:  # draw the plot in the same run: one quick run for every test
        args.append(f"--plot={tmp / 'bench.png'}")
    p = bench(*args)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return res, p.stdout, out


def test_json_last_line_and_out_file(quick):
    res, stdout, out = quick
    assert json.loads(out.read_text()) == res
    assert res['config']['quick'] is True and res['env']['device'] == 'cpu'
    assert 'training step' in stdout and 'decode' in stdout and 'prefill' in stdout


def test_training_figures(quick):
    res, _, _ = quick
    rows = {r['name']: r for r in res['train']}
    assert set(rows) == {'plain', 't2mlr+jacobi', 't2mlr+jacobi-exact', 'lrt+interleaved', 't2mlr+interleaved', 'lrt+jacobi',
                         't2mlr+jacobi+rc', 'lrt+interleaved+rc'}
    for name, r in rows.items():
        for k in ('step_ms', 'step_ms_min', 'step_ms_max', 'tokens_per_s', 'ratio', 'flop_ratio', 'ratio_over_flops',
                  'flops_per_token', 'achieved_gflops', 'act_mem_mb', 'act_mem_ratio', 'n_params', 'act_bytes_per_token'):
            assert finite_pos(r[k]), (name, k, r[k])
        assert r['step_ms_min'] <= r['step_ms'] <= r['step_ms_max']
        assert math.isfinite(r['loss'])
        assert r['step_peak_mem_mb'] is None  # cuda only
    assert rows['plain']['ratio'] == 1.0 and rows['plain']['flop_ratio'] == 1.0
    for name in rows:
        if name != 'plain':
            assert rows[name]['flop_ratio'] > 1, name  # every scheme makes extra passes
    # same backbone: the recurrent models only add their own parameters
    assert rows['t2mlr+jacobi']['n_params'] > rows['plain']['n_params']
    # activation checkpointing: the same arithmetic and more of it, far fewer bytes kept for backward
    for name in ('t2mlr+jacobi', 'lrt+interleaved'):
        assert rows[name + '+rc']['act_bytes_per_token'] < 0.5 * rows[name]['act_bytes_per_token']
        assert rows[name + '+rc']['flop_ratio'] == rows[name]['flop_ratio']


def test_memory_at_a_configs_size(quick):
    res, stdout, _ = quick
    full, rc = res['memory']
    assert full['mode'] == 'interleaved' and not full['recompute'] and rc['recompute'] and full['micro_batch'] == 8
    for r in (full, rc):
        assert finite_pos(r['saved_bytes_per_token']) and finite_pos(r['predicted_peak_gib']) and r['fits']
    assert rc['saved_bytes_per_token'] < full['saved_bytes_per_token'] and 'predicted peak' in stdout


def test_decode_figures(quick):
    res, _, _ = quick
    cfg = res['config']
    rows = res['decode']
    assert len(rows) == 3 * len(cfg['decode_batches']) * len(cfg['gen_lens'])
    seen = {(r['model'], r['batch'], r['gen_len']) for r in rows}
    for m in ('plain', 't2mlr', 'lrt'):
        for b in cfg['decode_batches']:
            for n in cfg['gen_lens']:
                assert (m, b, n) in seen
    for r in rows:
        for k in ('ms_per_token', 'tokens_per_s', 'ratio', 'flop_ratio', 'ratio_over_flops', 'ops_per_token',
                  'ops_ratio', 'us_per_op'):
            assert finite_pos(r[k]), (r, k)
        if r['model'] == 'plain':
            assert r['ratio'] == 1.0 and r['flop_ratio'] == 1.0
        else:
            assert r['flop_ratio'] > 1 and r['ops_per_token'] > 0
    for name, m in res['models'].items():
        assert m['rec_flops_per_token'] >= 0 and (m['rec_flops_per_token'] > 0) == (name != 'plain')


def test_decode_compiled_and_hf_peer(quick):
    res, stdout, _ = quick
    cfg = res['config']
    crows = res['decode_compiled']
    assert cfg['compile'] is True and len(crows) == len(res['decode'])
    for eager, comp in zip(res['decode'], crows):
        assert (eager['model'], eager['batch'], eager['gen_len']) == (comp['model'], comp['batch'], comp['gen_len'])
        for k in ('ms_per_token', 'tokens_per_s', 'ratio', 'flop_ratio', 'speedup_over_eager'):
            assert finite_pos(comp[k]), (comp, k)
        if comp['model'] == 'plain':
            assert comp['ratio'] == 1.0  # each recurrent model against COMPILED plain
    try:
        import transformers  # noqa: F401
    except ImportError:
        assert res['decode_hf'] == []
        return
    assert len(res['decode_hf']) == len(cfg['decode_batches']) * len(cfg['gen_lens'])
    for h in res['decode_hf']:
        assert finite_pos(h['ms_per_token']) and finite_pos(h['ratio_to_plain_compiled'])
        assert h['same_greedy_tokens'] is True  # same weights: HF's greedy tokens are the plain model's
    assert 'HF gen' in stdout


def test_prefill_figures(quick):
    res, _, _ = quick
    modes = {(r['model'], r['mode']) for r in res['prefill']}
    assert modes == ({('plain', 'plain'), ('plain', 'plain-compiled')}
                     | {(m, k) for m in ('t2mlr', 'lrt') for k in ('plain', 'exact', 'jacobi', 'jacobi-tol', 'exact-compiled')}
                     | {('ckpt', k) for k in ('plain', 'exact', 'jacobi', 'jacobi-tol')})
    for r in res['prefill']:
        if r['mode'] == 'jacobi-tol':  # to tolerance: never more than T + 1 span passes
            assert 2 <= r['span_passes'] <= r['prompt_len'] + 1
    for r in res['prefill']:
        for k in ('ms', 'tokens_per_s', 'ratio', 'flop_ratio', 'ratio_over_flops'):
            assert finite_pos(r[k]), (r, k)
        if r['mode'] == 'jacobi':
            assert r['n_iter'] == res['config']['D'] and r['flop_ratio'] > 1 and r['span_passes'] == r['n_iter'] + 1
        if r['mode'].endswith('-compiled'):
            assert finite_pos(r['ratio_to_plain_compiled'])


@pytest.mark.parametrize('args, msg', [
    (['--no_such_key=1'], 'unknown config key'),
    (['--D=eight'], 'D must be int'),
    (['--quick=maybe'], 'quick must be True or False'),  # 1/0 are bools (parse_bool)
    (['--gen_lens=(1, 2.5)'], 'must be a tuple of int'),
    (['D=8'], 'no config file'),
    (['--D'], 'must look like --key=value'),
    (['--dtype=float16'], "expected 'auto', 'float32' or 'bfloat16'"),
    (['--D=2', '--B=3'], 'need D >= 1, 0 <= B <= D'),
    (['--compile_mode=fast'], "compile_mode='fast'"),
    (['--compile_backend=tvm'], "compile_backend='tvm'"),
])
def test_bad_arguments_are_one_line_exit_2(args, msg):
    p = bench(*args)
    assert p.returncode == 2, (p.returncode, p.stderr)
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err


@pytest.mark.skipif(__import__('torch').cuda.is_available(), reason='needs a machine without cuda')
def test_cuda_without_cuda_is_one_line_exit_2():
    p = bench('--device=cuda')
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and 'cuda' in p.stderr


def test_config_file(tmp_path):
    cfg = tmp_path / 'c.py'
    cfg.write_text("D = 'x'\n")
    p = bench(str(cfg))
    assert p.returncode == 2 and 'must be int' in p.stderr


def test_plot(quick, tmp_path):
    """With matplotlib the quick run drew the plot; without it --plot is refused at once."""
    if HAVE_MPL:
        png = quick[2].parent / 'bench.png'
        assert png.stat().st_size > 0 and png.read_bytes()[:4] == b'\x89PNG'
        return
    p = bench('--quick=True', f'--plot={tmp_path / "x.png"}')
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and 'matplotlib' in p.stderr
    assert not (tmp_path / 'x.png').exists()
