"""
Summaries over seeds for compare.py's tables (docs/recipe.md): a run is a random draw, so a
result is the median and range over seeds, k of n, and, where two arms are compared, a rank
test on a continuous endpoint.

  med_range(xs)         (median, min, max)
  endpoints(train, ...)  the plateau-escape step, the loss spikes and the collapses of a training curve
  rank_test(a, b)       the two-sided p of the Mann-Whitney U test (exact for small samples)
"""

import itertools
import math
import random


def med_range(xs):
    """(median, min, max) over seeds."""
    s = sorted(xs)
    mid = len(s) // 2
    return (s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2), s[0], s[-1]


def endpoints(train, steps, escape_at, spike):
    """The continuous endpoints of one run's training curve, train = [[step, loss], ...] (the mean
    loss of each log interval): the plateau-escape step, the first step whose loss is below
    escape_at (steps + 1 if none: censored, which a rank test ranks last), the number of spikes
    after it: episodes of the loss more than `spike` above its running minimum since the escape,
    and of collapses: episodes of the loss back at escape_at or above, thrown back onto the
    plateau (an episode, however many logged steps it lasts, counts once)."""
    escape, spikes, collapses, low, up, back = steps + 1, 0, 0, math.inf, False, False
    for it, loss in train:
        if escape > steps and loss < escape_at:
            escape = it
        if escape > steps:
            continue
        low = min(low, loss)
        spikes += loss > low + spike and not up
        collapses += loss >= escape_at and not back
        up, back = loss > low + spike, loss >= escape_at
    return {'escape': escape, 'spikes': spikes, 'collapses': collapses}


def midranks(xs):
    """Ranks 1..n of xs, ties sharing the mean of their ranks."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks, i = [0.0] * len(xs), 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def rank_test(a, b):
    """Two-sided p of the Mann-Whitney U test of samples a and b (midranks for ties), exact: the
    share of all ways to split the pooled values into groups of len(a) and len(b) whose rank sum
    of the first group is at least as far from its mean as a's (200,000 random splits past that)."""
    ranks, n = midranks(list(a) + list(b)), len(a)
    mean, obs = n * (len(ranks) + 1) / 2, sum(ranks[:n])
    if math.comb(len(ranks), n) <= 200_000:
        splits = itertools.combinations(range(len(ranks)), n)
    else:
        rng = random.Random(0)
        splits = (rng.sample(range(len(ranks)), n) for _ in range(200_000))
    hits = total = 0
    for idx in splits:
        total += 1
        hits += abs(sum(ranks[i] for i in idx) - mean) >= abs(obs - mean) - 1e-9
    return hits / total


