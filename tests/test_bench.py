"""bench.py end to end, in --quick mode, through a subprocess: the last stdout line is
one JSON object holding every figure. Timings are never compared with thresholds
(the machine may be loaded): only presence, sign and finiteness are checked. The lab
scripts (prefill, HF peer, memory, profile): test_bench_lab.py; the plot of bench.py's
JSON: here."""

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


def bench(*args, cwd=ROOT, script='bench.py'):
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def finite_pos(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


@pytest.fixture(scope='module')
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('bench')
    out = tmp / 'bench.json'
    # compiled decode too, with dynamo's 'eager' backend: the same tracing, the same static
    # shapes and rows, without minutes of inductor code generation
    p = bench('--quick=True', '--threads=1', f'--out={out}', '--compile=True', '--compile_backend=eager', '--decode_batches=1')
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return res, p.stdout, out


def test_json_last_line_and_out_file(quick):
    res, stdout, out = quick
    assert json.loads(out.read_text()) == res
    assert res['config']['quick'] is True and res['env']['device'] == 'cpu'
    assert 'training step' in stdout and 'decode' in stdout
    assert len(res['env']['load_avg']) == 3  # the machine's load at the start is recorded


def test_training_figures(quick):
    res, _, _ = quick
    rows = {r['name']: r for r in res['train']}
    assert set(rows) == {'plain', 't2mlr+jacobi', 't2mlr+jacobi-exact', 'lrt+interleaved', 't2mlr+interleaved', 'lrt+jacobi',
                         't2mlr+jacobi+rc', 'lrt+interleaved+rc'}
    for name, r in rows.items():
        for k in ('step_ms', 'step_ms_min', 'step_ms_max', 'tokens_per_s', 'ratio', 'flop_ratio', 'ratio_over_flops',
                  'flops_per_token', 'achieved_gflops', 'n_params'):
            assert finite_pos(r[k]), (name, k, r[k])
        assert r['step_ms_min'] <= r['step_ms'] <= r['step_ms_max']
        assert math.isfinite(r['loss'])
    assert rows['plain']['ratio'] == 1.0 and rows['plain']['flop_ratio'] == 1.0
    for name in rows:
        if name != 'plain':
            assert rows[name]['flop_ratio'] > 1, name  # every scheme makes extra passes
    # same backbone: the recurrent models only add their own parameters
    assert rows['t2mlr+jacobi']['n_params'] > rows['plain']['n_params']
    # activation checkpointing: the same arithmetic (the bytes it saves: test_bench_lab.test_memory)
    for name in ('t2mlr+jacobi', 'lrt+interleaved'):
        assert rows[name + '+rc']['flop_ratio'] == rows[name]['flop_ratio']


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


def test_decode_compiled(quick):
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
    assert 'compiled' in stdout


@pytest.mark.parametrize('args, msg', [
    (['--no_such_key=1'], 'unknown config key'),
    (['--n_iter=eight'], 'n_iter must be int'),
    (['--quick=maybe'], 'quick must be True or False'),  # 1/0 are bools (parse_bool)
    (['--gen_lens=(1, 2.5)'], 'must be a tuple of int'),
    (['n_iter=8'], 'no config file'),
    (['--D'], 'must look like --key=value'),
    (['--dtype=float16'], "expected 'auto', 'float32' or 'bfloat16'"),
    (['--n_iter=2', '--n_grad=3'], 'need n_iter >= 1, 0 <= n_grad <= n_iter'),
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
    cfg.write_text("n_iter = 'x'\n")
    p = bench(str(cfg))
    assert p.returncode == 2 and 'must be int' in p.stderr


def test_plot(quick, tmp_path):
    """lab/plot.py draws the quick run's JSON with matplotlib; without it, it is refused at once."""
    png = tmp_path / 'x.png'
    p = bench(f'--results={quick[2]}', f'--out={png}', script='lab/plot.py')
    if HAVE_MPL:
        assert p.returncode == 0, p.stderr[-2000:]
        assert png.stat().st_size > 0 and png.read_bytes()[:4] == b'\x89PNG'
        return
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and 'matplotlib' in p.stderr
    assert not png.exists()
