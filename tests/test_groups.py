"""tasks.make_group's tables are groups (closure, identity, associativity, inverses), the
right ones (sizes, A5 = the even permutations of S5, the product is make_group's stated
convention), and running_product / task_labels give the labels of words checked by hand."""

import itertools

import numpy as np
import pytest

import prepare
from support import dataset, tasks
from support.tasks import make_group, running_product, task_labels

SIZES = {'S3': 6, 'A5': 60, 'S5': 120, 'Z5': 5}


@pytest.mark.parametrize('group', list(SIZES))
def test_table_is_a_group(group):
    names, mul = make_group(group)
    G = SIZES[group]
    assert len(names) == len(set(names)) == G and mul.shape == (G, G)
    assert mul.min() >= 0 and mul.max() < G  # closure
    # a Latin square: every row and every column is a permutation (cancellation both sides)
    for line in list(mul) + list(mul.T):
        assert sorted(line) == list(range(G))
    # element 0 is the identity (for permutations: the identity tuple)
    assert (mul[0] == np.arange(G)).all() and (mul[:, 0] == np.arange(G)).all()
    if not group.startswith('Z'):
        assert names[0] == ''.join(map(str, range(len(names[0]))))
    # every element has a two-sided inverse
    for a in range(G):
        b = int(np.flatnonzero(mul[a] == 0)[0])
        assert mul[b, a] == 0
    # associativity: (a.b).c == a.(b.c), every triple for the small groups, 20000 for S5
    if G <= 60:
        a, b, c = np.meshgrid(np.arange(G), np.arange(G), np.arange(G), indexing='ij')
    else:
        a, b, c = np.random.default_rng(0).integers(0, G, size=(3, 20000))
    assert (mul[mul[a, b], c] == mul[a, mul[b, c]]).all()


@pytest.mark.parametrize('group', ['S3', 'A5', 'S5'])
def test_product_is_the_stated_convention(group):
    # make_group's docstring: a.b = "apply a first, then b", (a.b)[i] = b[a[i]]; checked on the
    # names themselves for every pair (the table is built another way: searchsorted on base-n values)
    names, mul = make_group(group)
    index = {n: i for i, n in enumerate(names)}
    for x, y in itertools.product(range(len(names)), repeat=2):
        a, b = names[x], names[y]
        assert mul[x, y] == index[''.join(b[int(a[i])] for i in range(len(a)))]


def parity(p):
    """Even (0) or odd (1), from the cycle decomposition: n minus the number of cycles."""
    seen, cycles = set(), 0
    for i in range(len(p)):
        if i not in seen:
            cycles += 1
            while i not in seen:
                seen.add(i)
                i = p[i]
    return (len(p) - cycles) % 2


def test_a5_is_the_even_permutations_and_s3_is_not_abelian():
    s5, _ = make_group('S5')
    a5, mul_a5 = make_group('A5')
    assert a5 == [n for n in s5 if parity([int(c) for c in n]) == 0]
    assert len({parity([int(c) for c in n]) for n in a5}) == 1
    _, mul_s3 = make_group('S3')
    assert (mul_s3 != mul_s3.T).any()
    _, mul_z5 = make_group('Z5')
    assert (mul_z5 == mul_z5.T).all()

# -----------------------------------------------------------------------------
# words whose running products were worked out by hand with (a.b)[i] = b[a[i]]

def labels(group, word):
    names, mul = make_group(group)
    index = {n: i for i, n in enumerate(names)}
    y = running_product(mul, np.array([[index[w] for w in word.split()]]))[0]
    return ' '.join(names[i] for i in y)


@pytest.mark.parametrize('group,word,want', [
    # 102.021: 0->1->2, 1->0->0, 2->2->1 = 201;  201.120: 0->2->0, 1->0->1, 2->1->2 = 012 (identity)
    ('S3', '102 021 120', '102 201 012'),
    # a 3-cycle cubed: 120.120 = 201 (0->1->2, 1->2->0, 2->0->1), then 201.120 = 012
    ('S3', '120 120 120', '120 201 012'),
    # 021.102: 0->0->1, 1->2->2, 2->1->0 = 120;  120.021: 0->1->2, 1->2->1, 2->0->0 = 210
    # (the other order, 102.021, is 201 above: not abelian)
    ('S3', '021 102 021', '021 120 210'),
    # 10234.01342: 0->1->1, 1->0->0, 2->2->3, 3->3->4, 4->4->2 = 10342;
    # 10342.43210: 0->1->3, 1->0->4, 2->3->1, 3->4->0, 4->2->2 = 34102
    ('S5', '10234 01342 43210', '10234 10342 34102'),
    ('Z5', '3 4 2 1', '3 2 4 0'),
])
def test_hand_checked_words(group, word, want):
    assert labels(group, word) == want

# -----------------------------------------------------------------------------
# task_labels: the labels of an input recomputed from meta['task'] (what lab/evaluate.py shows)

def small(tmp_path, task, **kw):
    defaults = {'s5': tasks.S5_DEFAULTS, 's5_retrieval': tasks.RETRIEVAL_DEFAULTS}[task]
    cfg = dict(defaults, n_train=4, n_val=2, n_test=5, out_dir=str(tmp_path / task), **kw)
    out = {'s5': tasks.prepare_s5, 's5_retrieval': tasks.prepare_s5_retrieval}[task](cfg)
    return out, dataset.load_meta(out)


def test_task_labels_s5(tmp_path):
    d, meta = small(tmp_path, 's5', group='S3', train_len=6, test_lens='9')
    assert meta['task'] == {'name': 's5', 'group': 'S3'}
    index = {n: i for i, n in enumerate(meta['itos'])}
    got = task_labels(meta, [index[w] for w in '021 102 021'.split()])
    assert ' '.join(meta['itos'][i] for i in got) == '021 120 210'
    for split in meta['splits']:  # and the stored labels of every row
        x, y = dataset.load_split(d, split, meta)
        assert all(task_labels(meta, r.tolist()) == l.tolist() for r, l in zip(x, y))
    # a meta.json written before 'task' existed, another task, an empty input: no labels
    assert task_labels({k: v for k, v in meta.items() if k != 'task'}, [0, 1]) is None
    assert task_labels(dict(meta, task={'name': 'varassign'}), [0, 1]) is None
    assert task_labels(meta, []) is None


@pytest.mark.parametrize('layout', ['official', 'state'])
def test_task_labels_s5_retrieval(tmp_path, layout):
    d, meta = small(tmp_path, 's5_retrieval', group='S3', k=2, n_actions=5, test_actions='7', layout=layout)
    assert meta['task'] == {'name': 's5_retrieval', 'group': 'S3', 'k': 2, 'layout': layout}
    for split in meta['splits']:  # the position-by-position reading agrees with the generator, prefixes too
        x, y = dataset.load_split(d, split, meta)
        for r, l in zip(x, y):
            assert task_labels(meta, r.tolist()) == l.tolist()
            assert task_labels(meta, r[:23].tolist()) == l[:23].tolist()
    # by hand: dictionary 012:ab 021:cd 102:ef 120:gh 201:ij 210:kl, then moves 102, 021: states
    # 102 and 102.021 = 201; the values of the actions (official: ef, cd) or of the states (ef, ij)
    itos = meta['itos']
    index = {n: i for i, n in enumerate(itos)}
    words = '012 a b 021 c d 102 e f 120 g h 201 i j 210 k l | 102 _ _ 021 _ _'.split()
    got = task_labels(meta, [index[w] for w in words])
    prompt = words[:19] if layout == 'official' else ['-'] * 19
    want = prompt + ('102 e f 201 c d' if layout == 'official' else '102 e f 201 i j').split()
    assert [itos[i] if i >= 0 else '-' for i in got] == want
    # inputs that break the layout: no labels rather than wrong ones
    for bad in (words[:18] + ['102'] + words[19:],   # no separator
                words[:3] + ['012'] + words[4:],      # an element twice in the dictionary
                words[:-1] + ['a']):                  # a value where a blank belongs
        assert task_labels(meta, [index[w] for w in bad]) is None
