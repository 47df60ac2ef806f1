#!/usr/bin/env bash
# Every GPU check and benchmark, in one report for the README's GPU rows (docs/performance.md):
#
#     bash bench/gpu.sh [REPORT]          # default outputs/gpu-report.md; the commands' whole output in REPORT.log
#
# 1. exactness over NCCL: W = 1 against W = every GPU (DDP and FSDP) in float64, and torch's SyncBatchNorm
#    against one BatchNorm on the whole batch (tests/test_distributed.py's CUDA case);
# 2. bf16 against float32, solo against the bare model, for ResNet-50 at 224 px and ViT-B/16 (bench/throughput.py);
# 3. the augmentation on the device (bench/data.py);
# 4. FSDP's memory per rank against DDP's (bench/strategies.py).
#
# Each step stops after STEP_TIMEOUT seconds (default 600) and the report says so (exit status 124).
set -uo pipefail
cd "$(dirname "$0")/.."
report=${1:-outputs/gpu-report.md}
gpus=$(timeout 120 python -c "import torch; print(torch.cuda.device_count())")
if ! [ "$gpus" -ge 1 ] 2>/dev/null; then
  echo "bench/gpu.sh needs a GPU: torch sees none (torch.cuda.device_count() = 0)" >&2
  exit 1
fi
mkdir -p "$(dirname "$report")"
work=$(mktemp -d)
{
  echo "# solo on $(python -c "import torch; print(torch.cuda.get_device_name(0))") x $gpus"
  echo
  echo "$(date -u +%F), torch $(python -c "import torch; print(torch.__version__)"), commit $(git rev-parse --short HEAD)"
} > "$report"

step() {  # step TITLE COMMAND...: the command's output in the report, in a block under its title
  echo "== $1" >&2
  { echo; echo "## $1"; echo; echo '```'; echo "\$ ${*:2}"; } >> "$report"
  timeout "${STEP_TIMEOUT:-600}" "${@:2}" 2>>"$report.log" | tee -a "$report.log" >> "$report"
  echo "exit status ${PIPESTATUS[0]}" >> "$report"
  echo '```' >> "$report"
}

tiny="method=simclr data=synthetic data.image_size=32 data.num_samples=256 data.num_workers=2 trainer.max_steps=3
      trainer.precision=64 trainer.progress_bar=false trainer.plots=false optim.warmup_epochs=0"
compare() {  # compare RUN RUN: the largest weight difference between two runs' checkpoints
  python -c "
import sys, torch
a, b = (torch.load(f'{d}/checkpoints/last.pt', weights_only=True, map_location='cpu')['model'] for d in sys.argv[1:])
print('largest weight difference', max(float((a[k].double() - b[k].double()).abs().max()) for k in a if a[k].is_floating_point()))
" "$@"
}
nccl_exactness() {
  python main_pretrain.py $tiny data.batch_size=$((16 * gpus)) hydra.run.dir="$work/one" >/dev/null || return 1
  for strategy in ddp fsdp; do
    torchrun --nproc_per_node="$gpus" main_pretrain.py $tiny data.batch_size=16 trainer.strategy=$strategy \
      hydra.run.dir="$work/$strategy" >/dev/null || return 1
    echo -n "$strategy: " && compare "$work/one" "$work/$strategy"
  done
}
if [ "$gpus" -ge 2 ]; then
  export -f compare nccl_exactness && export tiny gpus work  # a function runs under timeout through bash
  step "W = 1 against W = $gpus over NCCL (float64, 3 steps)" bash -c nccl_exactness
else
  echo -e "\n## W = 1 against W > 1 over NCCL\n\nnot run: one GPU (NCCL needs one per process)" >> "$report"
fi
step "SyncBatchNorm on the GPU against one BatchNorm" python -m pytest -q tests/test_distributed.py -k cuda
for precision in 32 bf16; do
  step "ResNet-50, 224 px, $precision: solo against the bare model" python bench/throughput.py --device cuda \
    --backbone resnet50 --small-stem false --image-size 224 --batch 64 --precision $precision --nproc 1 --steps 30
  step "ViT-B/16, 224 px, $precision: solo against the bare model" python bench/throughput.py --device cuda \
    --backbone vit_base_patch16_224 --small-stem false --image-size 224 --batch 64 --precision $precision --nproc 1 \
    --steps 30
done
step "The augmentation on the device" python bench/data.py --device cuda
step "FSDP and DDP memory per rank, ViT-L/16" python bench/strategies.py memory --worlds $(printf "%s\n" 1 "$gpus" | sort -un)
rm -rf "$work"
echo "report: $report" >&2
