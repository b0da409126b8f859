"""Trust (issue 41): a checkpoint cannot run code, one writer per folder, an overwrite or a
re-prepare loses nothing until the new one exists, disk and permission faults are one line, and
a resume says what it does. train.py and sample.py run in this process (test_reliability.in_process),
the tools and the lock holders as processes."""

import os
import subprocess
import sys

import pytest
import torch

from test_bad_inputs import one_line, prep, snapshot, train_args, world  # noqa: F401 (world: a fixture)
from test_reliability import in_process
from test_train import ROOT


def script(*argv, cwd=None):
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, 'OMP_NUM_THREADS': '1'})


class Evil:
    """What a crafted checkpoint holds: unpickling it calls os.system."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}',))

# -----------------------------------------------------------------------------
# 1. a checkpoint cannot run code


def test_malicious_checkpoint_is_refused_unrun_by_every_reader(world, tmp_path):
    marker = tmp_path / 'ran'
    evil = tmp_path / 'evil' / 'ckpt.pt'
    evil.parent.mkdir()
    torch.save({'model': Evil(marker), 'model_args': {}, 'config': {}, 'optimizer': {}}, evil)
    data = [f'--data_root={world}/data', '--dataset=s5_Z2']
    results = {
        'sample.py': in_process('sample.py', ['--init_from=' + str(evil), *data, '--start=0 1'], tmp_path),
        'train.py': in_process('train.py', train_args(world, evil.parent, '--init_from=resume'), tmp_path),
    }
    for name, argv in [('replay.py', [os.path.join(ROOT, 'tools', 'replay.py'), evil, tmp_path / 'replay']),
                       ('bench.py', [os.path.join(ROOT, 'bench.py'), '--quick=True', '--threads=1', f'--prefill_ckpt={evil}'])]:
        p = script(*argv, cwd=tmp_path)
        results[name] = (p.returncode, p.stdout, p.stderr)
    from checkpoint import CheckpointError, load_checkpoint, read_checkpoint  # compare.py's readers
    for read in (read_checkpoint, load_checkpoint):
        with pytest.raises(CheckpointError, match='refused'):
            read(str(evil))
    for name, (code, out, err) in results.items():
        assert code != 0 and 'refused' in err and 'posix.system' in err and 'Traceback' not in err, (name, err)
        assert len([l for l in err.splitlines() if l.startswith('error:')]) == 1, (name, err)
    assert not marker.exists()


def test_real_checkpoints_still_load(world):
    # the allowlist covers what train.py saves (numpy's RNG state included), and a run resumes from it
    from checkpoint import read_checkpoint
    ck = read_checkpoint(str(world / 'run' / 'ckpt.pt'))
    assert ck['rng']['numpy'][1].dtype.name == 'uint32' and ck['iter_num'] == 2
    fixture = torch.load(os.path.join(ROOT, 'tests', 'fixtures', 'fingerprint.pt'), weights_only=True)
    assert fixture
