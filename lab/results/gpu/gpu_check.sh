#!/usr/bin/env bash
# GPU smoke check of this repo (~8 min on one H200; each section has a time cap): run from the repo root.
# The updated copy of ../shared/gpu_check.sh for this version's layout (support/checkpoint.py, support/corpora.py, the
# static KV buffers, recompute, the 135M configs' batch). Logs: $OUT or /tmp/gpu_check. C135=True compiles the 135M runs.
set -uo pipefail; export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8; PY=${PYTHON:-python3}; L=${OUT:-/tmp/gpu_check}; D=$L/data; mkdir -p "$D"
$PY -c 'import torch, numpy, pytest' 2>/dev/null || $PY -m pip install -q torch numpy pytest || exit 1
NG=$($PY -c 'import torch; print(torch.cuda.device_count())') && [ "$NG" -ge 1 ] || { echo "no CUDA GPU"; exit 1; }; sec() { echo; echo "=== $* [${SECONDS}s]"; }
sec "1. SDPA kernels as model.attend calls them (GQA 9/3); CUDA-graph decode; 135M step memory at the configs' micro-batch"
TORCH_LOGS=cudagraphs timeout -k 10 150 $PY - > "$L/probe.log" 2>&1 <<'EOF'
import runpy, time, torch, model; from torch._dynamo.utils import counters
dev, bf = 'cuda', torch.bfloat16; print('torch', torch.__version__, torch.cuda.get_device_name(), 'cudnn', torch.backends.cudnn.version())
torch.backends.cuda.enable_math_sdp(False)  # a shape no fused kernel takes raises instead of silently running the math path
for name, q, k, masked in [('training (causal, no mask)', 2048, 2048, 0), ('interleaved subset (bool mask, folded)', 1024, 2048, 1), ('static decode (bool mask, folded)', 1, 2048, 1)]:
    Q, KV = torch.randn(4, 9, q, 64, device=dev, dtype=bf), torch.randn(4, 3, k, 64, device=dev, dtype=bf)
    m = torch.ones(q, k, dtype=torch.bool, device=dev).tril(k - q) if masked else None
    try: model.attend(Q, KV, KV, m); print(f'SDPA {name}: fused kernel')
    except RuntimeError as e: print(f'SDPA {name}: NO fused kernel ({str(e)[:80]})')
torch.backends.cuda.enable_math_sdp(True)
for cfg in ('plain_135m_fineweb', 't2mlr_135m_fineweb', 'lrt_shared_fineweb'):
    c = runpy.run_path(f'config/{cfg}.py'); args = {k: c[k] for k in model.GPTConfig.__dataclass_fields__ if k in c}
    torch.manual_seed(0); g = model.GPT(model.GPTConfig(vocab_size=50257, vocab_pad=128, reset_token=50256, **args)).to(dev)
    kw = dict(mode=c.get('train_mode'), n_iter=c.get('n_iter', 8), n_grad=c.get('n_grad', 4), n_subsets=c.get('n_subsets', 2), recompute=c.get('recompute', False))
    opt, x = torch.optim.AdamW(g.parameters(), fused=True), torch.randint(0, 50257, (c['batch_size'], 2048), device=dev)
    torch.cuda.reset_peak_memory_stats(); fwd = torch.autocast('cuda', bf)(lambda: g(x, x, **kw)[1])
    try:
        for i in range(3): torch.cuda.synchronize(); t0 = time.time(); fwd().backward(); opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); print(f"135M {cfg:20s} micro-batch {c['batch_size']}: eager step {time.time() - t0:.2f}s, peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    except Exception as ex: print(f"135M {cfg:20s} FAILED: {type(ex).__name__} {str(ex)[:100]}")
    del g, opt, x, fwd; torch.cuda.empty_cache()
torch._dynamo.reset(); counters.clear(); torch.manual_seed(0)
g = model.GPT(model.GPTConfig(block_size=64, vocab_size=128, n_layer=2, n_head=4, n_kv_head=2, n_embd=64, recurrence='t2mlr', rec_start=0, rec_end=1)).to(dev).eval()
import engine; eng = engine.Engine(g, 'reduce-overhead')
idx = torch.randint(0, 128, (2, 8), device=dev); gen = lambda m=g: m.generate(idx, 24, temperature=0, prefill='plain')
try:
    a, b = gen(eng), gen(eng)
    print(f"Engine(compile='reduce-overhead').generate x2: cudagraph skips {counters['inductor']['cudagraph_skips']}, graphs {counters['stats']['unique_graphs']}, tokens == eager {torch.equal(a, gen()) and torch.equal(b, a)}")
except Exception as ex: print('generate compile failed:', type(ex).__name__, str(ex)[:300])
EOF
grep -E "^(torch|SDPA|generate|135M|Traceback|[A-Za-z]*Error)" "$L/probe.log"; echo "  'skipping cudagraphs' log lines: $(grep -c 'skipping cudagraphs' "$L/probe.log")"
sec "2. the tests that touch CUDA paths, on the CPU as CI runs them (they pin --device=cpu)"
timeout -k 10 120 $PY -m pytest -q -x -p no:cacheprovider tests/test_gpu_ready.py tests/test_decode.py 2>&1 | tail -3
sec "3. t2mlr_small on cuda, bf16, torch.compile (interleaved S=32); then torchrun x2 (NCCL) if >= 2 GPUs"
$PY prepare.py s5 --group=Z2 --out_dir="$D/s5_Z2" | tail -1
SMALL="config/t2mlr_small.py --data_root=$D --overwrite=True --device=cuda --compile=True --eval_first=False --eval_iters=2 --eval_exact_iters=1 --eval_examples=64 --log_interval=25"
timeout -k 10 90 $PY train.py $SMALL --out_dir="$L/small" --max_iters=100 --eval_interval=100 2>&1 | grep -E "^iter|eval step|test|rror" | tail -5
if [ "$NG" -ge 2 ]; then timeout -k 10 120 $PY -m torch.distributed.run --standalone --nproc_per_node=2 train.py $SMALL --out_dir="$L/ddp" \
  --max_iters=50 --eval_interval=50 --gradient_accumulation_steps=2 2>&1 | grep -E "^iter|eval step|rror" | tail -4; else echo "torchrun: skipped ($NG GPU)"; fi
sec "4. bench.py, lab/prefill.py, lab/memory.py --device=cuda: compiled decode/prefill in CUDA-graph mode (reduce-overhead), eager training ratios, step peaks"
TORCH_LOGS=cudagraphs timeout -k 10 80 $PY bench.py --device=cuda --compile=True --compile_mode=reduce-overhead --decode_batches=1 \
  --gen_lens=64 --train_reps=3 --decode_reps=3 --out="$L/bench.json" > "$L/bench.log" 2>&1
TORCH_LOGS=cudagraphs timeout -k 10 40 $PY lab/prefill.py --device=cuda --compile=True --compile_mode=reduce-overhead --prefill_reps=2 \
  --out="$L/prefill.json" >> "$L/bench.log" 2>&1
timeout -k 10 30 $PY lab/memory.py --device=cuda --out="$L/memory.json" >> "$L/bench.log" 2>&1
grep -v '^{' "$L/bench.log" | grep -v -i "cudagraph\|warn" | tail -48; echo "  'skipping cudagraphs' lines: $(grep -c 'skipping cudagraphs' "$L/bench.log")"
sec "5. 135M configs through train.py on synthetic GPT-2-vocab tokens, batch 4 x 2048, compile=${C135:-False}"
$PY -c "import sys, os, numpy as np; from support.corpora import write_token_meta as w; d, n, r = sys.argv[1], {'train': 20_000_000, 'val': 500_000}, np.random.default_rng(0)
os.makedirs(d, exist_ok=True); [(lambda a: (a.__setitem__(slice(None, None, 1000), 50256), a.tofile(f'{d}/{s}.bin')))(r.integers(0, 50256, n[s], dtype=np.uint16)) for s in n]
w(d, 'fineweb_edu', {s: (n[s], 4 * n[s]) for s in n}, 'gpt2', 50257, None, {})" "$D/fineweb_edu"
run135() {  # config, timeout, steps -> last log line, peak memory, wall time incl. the final eval + save
timeout -k 10 "$2" $PY - "config/$1.py" --data_root="$D" --out_dir="$L/o_$1" --overwrite=True --batch_size=4 --gradient_accumulation_steps=1 --max_iters="$3" \
  --warmup_iters=10 --eval_first=False --eval_iters=2 --eval_exact_iters=1 --log_interval=25 --compile="${C135:-False}" <<'EOF' 2>&1 | tee "$L/$1.log" | grep -E "^iter|eval step|PEAK|rror" | tail -3
import runpy, sys, time, torch; sys.argv, t = ['train.py'] + sys.argv[1:], time.time()
try: runpy.run_path('train.py', run_name='__main__')
finally: print(f'PEAK_GiB {torch.cuda.max_memory_allocated() / 2**30:.1f}, wall {time.time() - t:.0f}s (incl. final eval + save)')
EOF
}; run135 plain_135m_fineweb 60 100; run135 t2mlr_135m_fineweb 90 50; ms() { grep '^iter' "$L/$1.log" | tail -1 | sed -E 's/.*time ([0-9.]+)ms.*/\1/'; }
A=$(ms t2mlr_135m_fineweb); B=$(ms plain_135m_fineweb); [ -n "$A" ] && [ -n "$B" ] && awk -v a="$A" -v b="$B" 'BEGIN { printf "train-step ratio T2MLR(D=16,B=4)/plain: %.2f (%.0f / %.0f ms); FLOP model: 2.44\n", a / b, a, b }'
sec "done; logs in $L"
