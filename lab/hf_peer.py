"""
HF transformers' LlamaForCausalLM.generate (greedy, with the KV cache) at the plain model's shape and
weights, against bench.py's plain decode_step (eager and, with --compile=True, compiled) in the same
run: the reference implementation a user would otherwise run. Per decoded token, the prompt's prefill
left out on both sides; and whether HF's greedy tokens are the plain model's. bench.py's settings apply.

    python lab/hf_peer.py --compile=True --threads=1 --decode_batches=1 --gen_lens=64 --decode_reps=15
    python lab/hf_peer.py --quick=True
"""

import importlib.util
import itertools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # bench.py and the model: one folder up
import bench
from bench import decode_inputs, decode_run, med, round_robin, sync, table
from configurator import fail


def check():
    if importlib.util.find_spec('transformers') is None:
        fail("lab/hf_peer.py needs transformers, which is not installed (pip install transformers)")
    if min(bench.gen_lens) < 2:
        fail(f"gen_lens={bench.gen_lens}: HF's per-token clock needs at least 2 new tokens")


results = bench.setup(doc=__doc__, check=check)
import torch
from transformers import LogitsProcessor, LogitsProcessorList

from engine import Engine
from support.checkpoint import to_hf_llama


class Clock(LogitsProcessor):
    """HF runs its logits processors once per new token: from the first call to the last, n_gen - 1
    tokens are decoded, and the prompt's prefill is left out (as in bench.decode_run)."""

    def __init__(self):
        self.t = []

    def __call__(self, input_ids, scores):
        sync()
        self.t.append(time.perf_counter())
        return scores


def hf_run(hf, prompt, n_gen):
    """HF generate, greedy, n_gen new tokens -> (seconds per decoded token, the tokens)."""
    clock = Clock()
    with bench.ctx:
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n_gen, min_new_tokens=n_gen,
                          do_sample=False, use_cache=True, logits_processor=LogitsProcessorList([clock]), pad_token_id=0)
    return (clock.t[-1] - clock.t[0]) / (n_gen - 1), out


plain = bench.make_model('none').eval()
engine = Engine(plain, bench.CMODE) if bench.compile else None
hf = to_hf_llama(plain)
print(f"\nHF peer: LlamaForCausalLM.generate against plain decode_step, prompt {bench.prompt_len}, median of "
      f"{bench.decode_reps} runs, round-robin")
rows = []
for bsz, n_gen in itertools.product(bench.decode_batches, bench.gen_lens):
    prompt, toks = decode_inputs(bsz, n_gen)
    runs = {'plain': lambda: decode_run(plain, plain.decode_step, prompt, toks, False), 'hf': lambda: hf_run(hf, prompt, n_gen)[0]}
    if engine:
        runs['plain_compiled'] = lambda: decode_run(plain, engine.decode_step, prompt, toks, True)
    t = {k: med(ts) for k, ts in round_robin(runs, 1, bench.decode_reps).items()}  # the warm-up run compiles
    with bench.ctx:
        same = torch.equal(hf_run(hf, prompt, n_gen)[1], plain.generate(prompt, n_gen, temperature=0))
    rows.append(dict(model='hf_llama_generate', batch=bsz, gen_len=n_gen, ms_per_token=1e3 * t['hf'], tokens_per_s=bsz / t['hf'],
                     plain_ms_per_token=1e3 * t['plain'], ratio_to_plain_eager=t['hf'] / t['plain'],
                     ratio_to_plain_compiled=t['hf'] / t['plain_compiled'] if engine else None, same_greedy_tokens=same))
table(rows, [('batch', 'batch', '5d'), ('gen', 'gen_len', '5d'), ('HF ms/tok', 'ms_per_token', '9.3f'),
             ('plain ms/tok', 'plain_ms_per_token', '12.3f'), ('x plain', 'ratio_to_plain_eager', '7.3f'),
             ('x compiled plain', 'ratio_to_plain_compiled', '16.3f'), ('same tokens', lambda r: str(r['same_greedy_tokens']), '>11')])
print("  HF gen: LlamaForCausalLM.generate, greedy, use_cache, the plain model's weights, per decoded token; same "
      "tokens: HF's greedy tokens are the plain model's")
results['decode_hf'] = rows
bench.finish(results)
