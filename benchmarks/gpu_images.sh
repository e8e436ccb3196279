#!/usr/bin/env bash
# One prepared GPU session for issue 21 (docs/images.md, docs/benchmarks.md): the image benchmark
# at the FFM paper's CIFAR-10 U-Net and batch 128 (GOT vs vanilla, DP vs plain, bf16 autocast),
# then short GOT and vanilla trainings on synthetic CIFAR-shaped images (3 clients, batch 128,
# a width-32 U-Net of the paper's layout). Everything it measures lands in $OUT.
#   bash benchmarks/gpu_images.sh          (from the repository root; wheels in .whl/ if any)
set -u
OUT=${OUT:-/tmp/gpu-images-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then  # packages the device image lacks (POT, opacus, cryptography, ...)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, opacus, ot; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'opacus', opacus.__version__, 'POT', ot.__version__)"
  nproc; } > "$OUT/bench_log.txt" 2>&1
cat "$OUT/bench_log.txt"

SECONDS=0
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout 170 python3 benchmarks/images.py --rounds 5 --warmup 2 --out "$OUT/bench.md" \
    2>> "$OUT/bench_log.txt"
  echo "benchmark: exit $? after ${SECONDS}s"
fi

for method in vanilla got; do
  SECONDS=0
  timeout "${TRAIN_TIMEOUT:-100}" python3 -m secureffm run --method "$method" --data shapes --clients 3 \
    --partition dirichlet --dirichlet-alpha 1.0 --shard-size 4000 --batch-size 128 \
    --rounds "${ROUNDS:-800}" --unet-layout guided --unet-width 32 --unet-mult 1,2,2,2 --unet-blocks 2 \
    --unet-attention 16 --lr 2e-4 --ema-decay 0.999 --candidates 128 --potential-every 5 \
    --ctransform-steps 5 --ctransform-lr 0.5 --eval-samples 2000 --nfe 1,4,16 \
    --sample-every 200 --checkpoint-every 200 --device auto --insecure-deterministic \
    --out "/tmp/run-$method" >> "$OUT/train_log.txt" 2>&1
  echo "$method: exit $? after ${SECONDS}s"
  cp "/tmp/run-$method/metrics.json" "$OUT/${method}_metrics.json" 2>/dev/null
  cp "/tmp/run-$method/samples.png" "$OUT/${method}_samples.png" 2>/dev/null \
    || cp "$(ls /tmp/run-$method/samples/*.png 2>/dev/null | tail -1)" "$OUT/${method}_samples.png"
  tail -c 400 "$OUT/train_log.txt"; echo
done
python3 - "$OUT" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*_metrics.json")):
    m = json.loads(f.read_text())
    print(f.name, {k: m.get(k) for k in ("device", "precision", "parameters", "rounds",
          "train_seconds", "seconds_per_round", "images_per_second", "peak_gpu_memory_gb")},
          m["eval"]["fid"], "floor", m["eval"]["fid_floor"])
PY
