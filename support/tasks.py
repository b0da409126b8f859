"""
The built-in synthetic tasks, each a generator of (input, aligned label) rows written by
dataset.write_task: the group word problem s5 (state tracking), s5_retrieval (T2MLR's
S5-Retrieval: state tracking + lookup in an in-context dictionary), varassign (variable
assignment chains) and assoc (associative recall: the lookup alone, no state to track).
task_labels recomputes the labels of an input (lab/evaluate.py shows them).
"""

import itertools
import os
import re
import string

import numpy as np

from configurator import fail
from support.dataset import DATA_DIR, DataError, parse_lens, task_sizes, write_task

# A row is one training or test sequence. Longer ones are no task a model here trains on, and
# a chunk of 4096 of them would not fit in memory (1e7 tokens a row: hours, then out of memory)
MAX_ROW_LEN = 8192
MAX_TASK_VOCAB = 65536  # a task's words (a vocabulary of 1e9 words is a list no machine here holds)


def check_row_len(flags, T):
    """A row length from the options, computed before anything is generated: one line past MAX_ROW_LEN."""
    if T > MAX_ROW_LEN:
        fail(f"{flags}: rows of {T:,} tokens; at most {MAX_ROW_LEN:,}")

# -----------------------------------------------------------------------------
# finite groups, for the state tracking tasks

def make_group(name):
    """-> (names, mul). Element 0 is the identity; mul[a, b] = index of the product a.b.

    Convention: a permutation p is a tuple with p[i] = the image of point i, and
    a.b = "apply a first, then b", i.e. (a.b)[i] = b[a[i]]. So the running product
    x_0.x_1...x_t is where every point ends up after the moves x_0, x_1, ..., x_t in order
    (as functions: x_t o ... o x_0). Z<n>: addition mod n (abelian, no convention needed).
    S<n>: all permutations of 0..n-1, A<n>: the even ones, both in lexicographic order
    (which puts the identity first); names are the tuples written as digits, e.g. '10234'."""
    m = re.fullmatch(r'([ZSA])(\d+)', name)
    if not m:
        raise DataError(f"unknown group {name!r}; expected Z<n> (cyclic, e.g. Z2 = parity), S<n> or A<n> (e.g. S3, S5, A5)")
    kind, n = m.group(1), int(m.group(2))
    if kind == 'Z':
        if not 2 <= n <= 4096:
            raise DataError(f"group {name}: need 2 <= n <= 4096")
        a = np.arange(n)
        return [str(k) for k in range(n)], (a[:, None] + a[None, :]) % n
    if not (2 if kind == 'S' else 3) <= n <= 6:
        raise DataError(f"group {name}: S<n> needs 2 <= n <= 6, A<n> needs 3 <= n <= 6")
    perms = list(itertools.permutations(range(n)))
    if kind == 'A':
        perms = [p for p in perms if sum(p[i] > p[j] for i in range(n) for j in range(i + 1, n)) % 2 == 0]
    P = np.array(perms)  # (G, n)
    G = len(P)
    # comp[a, b, i] = P[b, P[a, i]] = (a.b)[i], shape (G, G, n)
    comp = P[np.arange(G)[None, :, None], P[:, None, :]]
    # lexicographic order of permutations = increasing order of their base-n value: index by searchsorted
    weights = n ** np.arange(n - 1, -1, -1)
    mul = np.searchsorted(P @ weights, comp @ weights)
    return [''.join(map(str, p)) for p in perms], mul


def running_product(mul, x):
    """x: (N, T) element ids -> (N, T), y[:, t] = x[:, 0].x[:, 1]...x[:, t]."""
    y = np.empty_like(x)
    y[:, 0] = x[:, 0]
    for t in range(1, x.shape[1]):
        y[:, t] = mul[y[:, t - 1], x[:, t]]
    return y

# -----------------------------------------------------------------------------
# task 1: s5, the group word problem (state tracking)

S5_DEFAULTS = dict(group='S5', train_len=32, test_lens='48,64', n_train=20000, n_val=500, n_test=1000, seed=1337, out_dir='')


def prepare_s5(cfg):
    """Tokens are group elements (vocab = the group). x_t uniform, y_t = x_0.x_1...x_t (see
    make_group for the convention). Every position is labelled, so one row of length 32
    trains every length 1..32 at once. Split test_<L> holds rows of length L."""
    names, mul = make_group(cfg['group'])
    G = len(names)
    lens = [cfg['train_len']] + parse_lens(cfg['test_lens'], 'test_lens')
    if min(lens) < 1:
        raise DataError(f"s5 needs rows of at least 1 token: --train_len={cfg['train_len']} --test_lens={cfg['test_lens']}")
    check_row_len(f"--train_len={cfg['train_len']} --test_lens={cfg['test_lens']}", max(lens))

    def make_gen(T):
        def generate(rng, rows):
            x = rng.integers(0, G, size=(rows, T))
            return x, running_product(mul, x)
        return generate

    name = f"s5_{cfg['group']}"
    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, name)
    write_task(out_dir, cfg, name, names, make_gen, task_sizes(cfg, lens[0], lens[1:]), row_len=lambda T: T,
               task=dict(name='s5', group=cfg['group']))
    return out_dir

# -----------------------------------------------------------------------------
# task 2: s5_retrieval (T2MLR's S5-Retrieval): state tracking + in-context lookup

RETRIEVAL_DEFAULTS = dict(group='S5', k=4, n_actions=32, test_actions='48,64', layout='official', n_train=20000,
                          n_val=500, n_test=1000, seed=1337, out_dir='')
VALUE_CHARS = string.ascii_letters + string.digits  # the official value alphabet


def prepare_s5_retrieval(cfg):
    """T2MLR's S5-Retrieval. layout='official' follows the official generator (princeton-pli/T2MLR,
    scripts/s5_retrieval/data_generation/make_s5_retrieval_dataset.py; DESIGN.md 11):
        dictionary   key v_1..v_k   for min(n_actions, G) distinct keys: every action the row uses,
                                    then unused elements, in a random order; v = k random characters
        '|'
        moves        a_1 _ .. _  a_2 _ .. _  ...   (n_actions moves, each followed by k blanks '_')
    Targets, at every position: a copy of the input on the dictionary and '|'; at a move, the
    state s_i = a_1.a_2...a_i (running product from the identity); at its k blanks, the value the
    dictionary holds for the ACTION a_i. The dictionary and '|' run without the recurrence (the
    official control flow 1): the meta has rec_mask, and {split}_m.bin marks the moves and blanks.
    layout='state' is a harder variant: a dictionary of every group element, the value looked
    up for the STATE s_i, the dictionary and '|' unlabelled, the recurrence on everywhere.
    Vocabulary: group elements (ids 0..G-1), then VALUE_CHARS, then '|', then '_'.
    Split test_<N> holds rows with N moves."""
    names, mul = make_group(cfg['group'])
    if not cfg['group'].startswith(('S', 'A')):
        raise DataError(f"s5_retrieval needs a permutation group (S<n> or A<n>), got {cfg['group']}: the names of Z<n> elements clash with the value characters")
    G, k, layout = len(names), cfg['k'], cfg['layout']
    if k < 1:
        raise DataError(f"--k={k}: need k >= 1")
    if layout not in ('official', 'state'):
        raise DataError(f"--layout={layout}: expected official (the official generator's rows) or state")
    moves_per_split = [cfg['n_actions']] + parse_lens(cfg['test_actions'], 'test_actions')
    if min(moves_per_split) < 1:
        raise DataError(f"s5_retrieval needs at least 1 move: --n_actions={cfg['n_actions']} --test_actions={cfg['test_actions']}")
    C0, SEP, BLANK = G, G + len(VALUE_CHARS), G + len(VALUE_CHARS) + 1  # ids of the first value character, '|', '_'
    itos = names + list(VALUE_CHARS) + ['|', '_']
    entries = lambda A: G if layout == 'state' else min(A, G)  # dictionary entries
    row_len = lambda A: (entries(A) + A) * (k + 1) + 1  # the dictionary, '|', the moves and their blanks
    check_row_len(f"--n_actions={cfg['n_actions']} --test_actions={cfg['test_actions']} --k={k} (group {cfg['group']})",
                  row_len(max(moves_per_split)))

    def make_gen(A):
        D = entries(A)

        def generate(rng, rows):
            moves = rng.integers(0, G, size=(rows, A))
            state = running_product(mul, moves)                                 # (rows, A)
            values = rng.integers(0, len(VALUE_CHARS), size=(rows, G, k))       # values[r, g]: g's value
            r = np.arange(rows)[:, None]
            if layout == 'state':
                keys = rng.permuted(np.tile(np.arange(G), (rows, 1)), axis=1)
            else:  # the actions used, then unused elements, D in all, shuffled
                keys = np.empty((rows, D), dtype=np.int64)
                for i in range(rows):
                    used = np.unique(moves[i])
                    rest = rng.permutation(np.setdiff1d(np.arange(G), used))[:D - len(used)]
                    keys[i] = rng.permutation(np.concatenate([used, rest]))
            looked_up = state if layout == 'state' else moves
            dict_x = np.concatenate([keys[:, :, None], C0 + values[r, keys]], axis=2).reshape(rows, -1)
            act_x = np.concatenate([moves[:, :, None], np.full((rows, A, k), BLANK)], axis=2).reshape(rows, -1)
            act_y = np.concatenate([state[:, :, None], C0 + values[r, looked_up]], axis=2).reshape(rows, -1)
            prompt = np.concatenate([dict_x, np.full((rows, 1), SEP)], axis=1)
            x = np.concatenate([prompt, act_x], axis=1)
            if layout == 'state':
                return x, np.concatenate([np.full(prompt.shape, -1), act_y], axis=1)
            m = np.concatenate([np.zeros(prompt.shape), np.ones(act_x.shape)], axis=1)
            return x, np.concatenate([prompt, act_y], axis=1), m
        return generate

    name = f"s5_retrieval_{cfg['group']}" + ('_state' if layout == 'state' else '')
    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, name)
    sizes = task_sizes(cfg, moves_per_split[0], moves_per_split[1:])
    write_task(out_dir, cfg, name, itos, make_gen, sizes, row_len=row_len,
               task=dict(name='s5_retrieval', group=cfg['group'], k=k, layout=layout))
    return out_dir


def task_labels(meta, ids):
    """The true labels of an input (token ids) of a task whose labels follow from its input, as
    meta['task'] records it (s5, s5_retrieval): what the generator would have stored as y for a
    row (or a prefix of one) with these tokens. -> list of ints (-1 = unlabelled), or None for
    any other task, a meta.json written before meta['task'] existed, or an input that is not
    (a prefix of) a row of the task. lab/evaluate.py shows these next to the model's predictions."""
    task = meta.get('task') or {}
    if task.get('name') not in ('s5', 's5_retrieval') or not len(ids):
        return None
    names, mul = make_group(task['group'])
    G = len(names)
    if task['name'] == 's5':
        x = np.asarray(ids, dtype=np.int64)
        return running_product(mul, x[None])[0].tolist() if x.max() < G else None
    return retrieval_labels([int(t) for t in ids], G, task['k'], mul, task.get('layout', 'state'))


def retrieval_labels(x, G, k, mul, layout='official'):
    """s5_retrieval's labels for a prefix x of a row (layout in prepare_s5_retrieval), read
    position by position (the generator builds whole rows at once: the tests compare the two).
    None where x breaks the layout (dictionary entries, separator, move/blank pattern)."""
    SEP, BLANK = G + len(VALUE_CHARS), G + len(VALUE_CHARS) + 1
    value, y, state, action, sep = {}, [], None, None, None
    for p, tok in enumerate(x):
        if sep is None:  # the dictionary: key, then its k value characters; then '|'
            j, e = p % (k + 1), p - p % (k + 1)
            if tok == SEP and j == 0 and value:
                sep = p
            elif j == 0 and (tok >= G or tok in value) or j > 0 and not G <= tok < SEP:
                return None
            if j == k:
                value[x[e]] = x[e + 1:p + 1]
            y.append(tok if layout == 'official' else -1)
        elif (p - sep - 1) % (k + 1) == 0:  # a move: the label is the state after it
            if tok >= G or (layout == 'state' and len(value) != G) or (layout == 'official' and tok not in value):
                return None
            state, action = tok if state is None else int(mul[state, tok]), tok
            y.append(state)
        else:  # a blank: the next value character of the action's (official) or the state's entry
            if tok != BLANK:
                return None
            y.append(value[action if layout == 'official' else state][(p - sep - 1) % (k + 1) - 1])
    return y


def position_kinds(meta, split):
    """The positions of s5_retrieval rows by what their label is: {'state': (T,) bool, 'value':
    (T,) bool} for split; None for other data. The three figures the official code reports
    come from these: accuracy at the states, at the values, and whole-row exact match."""
    task = meta.get('task') or {}
    if task.get('name') != 's5_retrieval':
        return None
    T, k = meta['splits'][split]['len'], task['k']
    A = meta['splits'][split]['param']
    prompt = T - A * (k + 1)  # dictionary and '|'
    p = np.arange(T)
    state = (p >= prompt) & ((p - prompt) % (k + 1) == 0)
    return {'state': state, 'value': (p >= prompt) & ~state}


def task_rec_mask(meta, ids):
    """The recurrence mask of an input of a task whose data carries one (s5_retrieval, official
    layout): off up to and including the first '|', on after it. None for other data."""
    task = meta.get('task') or {}
    if task.get('name') != 's5_retrieval' or task.get('layout', 'state') != 'official':
        return None
    sep = len(make_group(task['group'])[0]) + len(VALUE_CHARS)
    cut = ids.index(sep) + 1 if sep in ids else len(ids)
    return [False] * cut + [True] * (len(ids) - cut)


# -----------------------------------------------------------------------------
# task 3: varassign, variable assignment chains

VARASSIGN_DEFAULTS = dict(depth=4, test_depths='6,8', n_chains=3, n_branch=2, n_vars=52, n_train=20000, n_val=500,
                          n_test=1000, seed=1337, out_dir='')


def var_names(n):
    """a..z, then aa, ab, .. (one token each)."""
    letters = 'abcdefghijklmnopqrstuvwxyz'
    names = list(letters) + [a + b for a in letters for b in letters]
    return names[:n]


def prepare_varassign(cfg):
    """Lines `x = y ;` in a small word vocabulary, one token per word:
        digits 0..9 (ids 0..9), '=', ';', '?' (ids 10, 11, 12), variables (ids 13..).
    A row holds n_chains chains of `depth` aliases, u0 = digit ; u1 = u0 ; ... ; u_depth = u_{depth-1} ;
    (the other chains are distractors with their own digits), plus n_branch dead-end aliases
    `w = u` onto random chain variables, all lines shuffled, then the query `? u_depth` of chain 0.
    Variable names are drawn at random per row, so nothing marks the queried chain.
    Target: the digit the query resolves to, at the LAST position only (-1 elsewhere).
    Split test_<D> holds chains of depth D (length 4 * (n_chains * (D + 1) + n_branch) + 2)."""
    depths = [cfg['depth']] + parse_lens(cfg['test_depths'], 'test_depths')
    C, nb, nv = cfg['n_chains'], cfg['n_branch'], cfg['n_vars']
    if min(depths) < 0 or C < 1 or nb < 0:
        raise DataError("varassign needs depth >= 0, n_chains >= 1, n_branch >= 0")
    need = C * (max(depths) + 1) + nb
    if not need <= nv <= 702:
        raise DataError(f"varassign: depth {max(depths)} with {C} chains and {nb} branches needs {need} variables; "
                        f"set {need} <= --n_vars <= 702 (got {nv})")
    EQ, SEMI, Q, V0 = 10, 11, 12, 13
    itos = [str(d) for d in range(10)] + ['=', ';', '?'] + var_names(nv)

    def make_gen(D):
        def generate(rng, rows):
            nc = C * (D + 1)  # chain variables per row
            names = V0 + rng.permuted(np.tile(np.arange(nv), (rows, 1)), axis=1)[:, :nc + nb]
            chain = names[:, :nc].reshape(rows, C, D + 1)          # chain[r, c, j] = u_j of chain c
            digits = rng.integers(0, 10, size=(rows, C))
            rhs = np.concatenate([digits[:, :, None], chain[:, :, :-1]], axis=2)   # u_0 = digit, u_j = u_{j-1}
            lhs = np.concatenate([chain.reshape(rows, nc), names[:, nc:]], axis=1)  # + branch variables
            targets = names[np.arange(rows)[:, None], rng.integers(0, nc, size=(rows, nb))]
            rhs = np.concatenate([rhs.reshape(rows, nc), targets], axis=1)
            L = nc + nb
            lines = np.stack([lhs, np.full((rows, L), EQ), rhs, np.full((rows, L), SEMI)], axis=2)  # (rows, L, 4)
            shuffle = rng.permuted(np.tile(np.arange(L), (rows, 1)), axis=1)
            lines = np.take_along_axis(lines, shuffle[:, :, None], axis=1)
            x = np.concatenate([lines.reshape(rows, -1), np.full((rows, 1), Q), chain[:, 0, -1:]], axis=1)
            y = np.full(x.shape, -1)
            y[:, -1] = digits[:, 0]  # digit d is token id d
            return x, y
        return generate

    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, 'varassign')
    write_task(out_dir, cfg, 'varassign', itos, make_gen, task_sizes(cfg, depths[0], depths[1:]),
               row_len=lambda D: 4 * (C * (D + 1) + nb) + 2)  # (n_vars <= 702 keeps rows short)
    return out_dir

# -----------------------------------------------------------------------------
# task 4: assoc, associative recall (a pure lookup: the control with no state to track)

ASSOC_DEFAULTS = dict(n_keys=16, n_values=16, n_pairs=8, n_queries=32, test_queries='48,64', n_train=20000, n_val=500,
                      n_test=1000, seed=1337, out_dir='')


def prepare_assoc(cfg):
    """Associative recall from an in-context dictionary, with nothing to carry from one query to
    the next (s5_retrieval's lookup without its state tracking):
        dictionary   k v k v ... k v   n_pairs distinct keys (of n_keys), each with a random value (of n_values)
        '|'
        queries      q_1 q_2 ... q_Q   Q = n_queries keys, each drawn from the row's dictionary
    Targets: at each query its value in the dictionary, -1 elsewhere (the dictionary and '|').
    Vocabulary: keys k0.. (ids 0..n_keys-1), then values v0.., then '|'. Split test_<Q> holds
    rows of Q queries after a dictionary of the same size."""
    K, V, P = cfg['n_keys'], cfg['n_values'], cfg['n_pairs']
    queries = [cfg['n_queries']] + parse_lens(cfg['test_queries'], 'test_queries')
    if min(V, P, *queries) < 1 or P > K:
        raise DataError(f"assoc needs 1 <= n_pairs <= n_keys, n_values >= 1 and queries >= 1: --n_keys={K} "
                        f"--n_values={V} --n_pairs={P} --n_queries={cfg['n_queries']} --test_queries={cfg['test_queries']}")
    # sized from the options before anything is built: --n_queries=1e9 once generated until out of memory
    check_row_len(f"--n_pairs={P} --n_queries={cfg['n_queries']} --test_queries={cfg['test_queries']}", 2 * P + 1 + max(queries))
    if K + V + 1 > MAX_TASK_VOCAB:
        raise DataError(f"assoc: --n_keys={K} --n_values={V} make {K + V + 1:,} tokens; at most {MAX_TASK_VOCAB:,}")
    itos = [f'k{i}' for i in range(K)] + [f'v{i}' for i in range(V)] + ['|']

    def make_gen(Q):
        def generate(rng, rows):
            keys = rng.permuted(np.tile(np.arange(K), (rows, 1)), axis=1)[:, :P]  # (rows, P), distinct in a row
            values = K + rng.integers(0, V, size=(rows, P))                       # (rows, P) value ids
            asked = rng.integers(0, P, size=(rows, Q))                            # the entry each query asks for
            r = np.arange(rows)[:, None]
            pairs = np.stack([keys, values], axis=2).reshape(rows, 2 * P)
            x = np.concatenate([pairs, np.full((rows, 1), K + V), keys[r, asked]], axis=1)
            y = np.concatenate([np.full((rows, 2 * P + 1), -1), values[r, asked]], axis=1)
            return x, y
        return generate

    out_dir = cfg['out_dir'] or os.path.join(DATA_DIR, 'assoc')
    write_task(out_dir, cfg, 'assoc', itos, make_gen, task_sizes(cfg, queries[0], queries[1:]),
               row_len=lambda Q: 2 * P + 1 + Q, task=dict(name='assoc', n_keys=K, n_values=V, n_pairs=P))
    return out_dir
