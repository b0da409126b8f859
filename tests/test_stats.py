"""lab/compare.py's summaries (lab/stats.py): the rank test against hand counts (and scipy where it is
installed), the plateau-escape step and the spike count on made-up curves."""

import importlib.util
import math
import os

import pytest

# lab/stats.py by its path: lab/ on sys.path would put its scripts (evaluate, memory, ...) there as modules
_spec = importlib.util.spec_from_file_location('stats', os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'lab', 'stats.py'))
_stats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_stats)
endpoints, med_range, midranks, rank_test = _stats.endpoints, _stats.med_range, _stats.midranks, _stats.rank_test


def test_rank_test_by_hand():
    # complete separation of 3 and 3: 2 of the C(6,3) = 20 splits are as extreme -> p = 0.1
    assert rank_test([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
    assert rank_test([4, 5, 6], [1, 2, 3]) == pytest.approx(0.1)
    # 5 against 5, separated: 2 / 252
    assert rank_test([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(2 / 252)
    # identical samples (all ties): no evidence at all
    assert rank_test([1, 1, 1], [1, 1, 1]) == 1.0
    # interleaved: rank sums 1+3+5 = 9 vs mean 10.5; |9 - 10.5| is reached by 14 of 20 splits
    assert rank_test([1, 3, 5], [2, 4, 6]) == pytest.approx(14 / 20)


def test_midranks_share_ties():
    assert midranks([10, 20, 20, 30]) == [1, 2.5, 2.5, 4]


def test_rank_test_agrees_with_scipy():
    stats = pytest.importorskip('scipy.stats')
    a, b = [0.31, 0.12, 0.55, 0.08, 0.40], [0.61, 0.72, 0.29, 0.93, 0.88, 0.47]
    want = stats.mannwhitneyu(a, b, alternative='two-sided', method='exact').pvalue
    assert rank_test(a, b) == pytest.approx(want, rel=1e-9)


def test_endpoints():
    # a plateau, the escape at 300, a spike episode over two logged steps (one spike), a second one
    train = [[50, 0.69], [100, 0.68], [150, 0.6], [200, 0.5], [250, 0.3], [300, 0.15], [350, 0.05],
             [400, 0.45], [450, 0.5], [500, 0.04], [550, 0.35], [600, 0.02]]
    # both spikes go back above the escape threshold, 0.2: two collapses; above 0.4, the first only
    assert endpoints(train, 600, 0.2, 0.25) == {'escape': 300, 'spikes': 2, 'collapses': 2}
    assert endpoints(train, 600, 0.4, 0.25)['collapses'] == 1  # (escape at 250, at 0.3)
    # never below the threshold: censored at steps + 1, no spikes counted
    assert endpoints(train[:5], 600, 0.2, 0.25) == {'escape': 601, 'spikes': 0, 'collapses': 0}
    # a rise of exactly the threshold is no spike
    assert endpoints([[10, 0.1], [20, 0.35]], 20, 0.2, 0.25)['spikes'] == 0


def test_med_range():
    assert med_range([3, 1, 2]) == (2, 1, 3)
    assert med_range([4, 1, 2, 3]) == (2.5, 1, 4)
    assert all(math.isfinite(v) for v in med_range([0.5]))
