#!/usr/bin/env bash
# Every GPU check and benchmark in one report for docs/performance.md's GPU rows, in at most 9 minutes on one GPU:
#
#     bash bench/gpu.sh [--dry-run] [REPORT]   # default outputs/gpu-report.md; every step's output in REPORT.log
#
# 1. torch's SyncBatchNorm against solo's global BatchNorm on the same batch, and both against one BatchNorm;
# 2. trainer.accumulate=2 against 1 in float64 on the device;
# 3. ResNet-50 and ViT-B/16 at 224 px, bf16 and float32: solo against the bare model, samples/s and peak memory;
# 4. kernel launches per step, solo against the bare model (bench/launches.py);
# 5. the augmentation on the device against the CPU workers, and the device's views against the CPU's;
# 6. trainer.compile off, blocks and step, against the bare model's eager loop, with launches per step;
# 7. host syncs in a training step (torch.cuda.set_sync_debug_mode);
# 8. W = 1 against W = every GPU over NCCL, with 2 GPUs or more.
#
# The machine's own python3 runs it: the pure-Python wheels in .whl/ (hydra-core, omegaconf, antlr4-python3-runtime,
# tqdm; bench/README.md) are installed offline into a folder of the run's own, solo runs from this checkout. Each
# step has its own time limit (STEP_TIMEOUT=SECONDS sets them all) within the kit's budget (KIT_BUDGET, default
# 540 s in all); a step that does not finish is killed and marked so, and the report is always written.
# --dry-run: the same driver (bench/gpu.py) on the CPU at toy sizes, which tests/test_gpu_kit.py runs.
set -uo pipefail
started=$SECONDS
dry=()
if [ "${1:-}" = "--dry-run" ]; then
  dry=(--dry-run)
  shift
fi
report=$(realpath -m "${1:-$(dirname "$0")/../outputs/gpu-report.md}")
cd "$(dirname "$0")/.."
budget=${KIT_BUDGET:-540}

gpus=0
name=""
if [ ${#dry[@]} -eq 0 ]; then
  # In a process of its own: the driver forks its steps, and a process that has used CUDA cannot fork.
  found=$(timeout 60 python3 -c "import torch; n = torch.cuda.device_count(); print(n, torch.cuda.get_device_name(0) if n else '')")
  gpus=${found%% *}
  name=${found#* }
  if ! [ "${gpus:-0}" -ge 1 ] 2> /dev/null; then
    echo "bench/gpu.sh needs a GPU: torch sees none (torch.cuda.device_count() = ${gpus:-?}); bash bench/gpu.sh --dry-run runs it on the CPU" >&2
    exit 1
  fi
fi

mkdir -p "$(dirname "$report")"
: > "$report.log"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
notes=()
if compgen -G ".whl/*.whl" > /dev/null; then
  wheels="$(cd .whl && echo *.whl)"
  if timeout 60 python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "$work/site" \
    .whl/*.whl >> "$report.log" 2>&1; then
    notes+=(--note "Installed offline from .whl/ with pip: $wheels.")
  else  # no pip: a pure-Python wheel is a zip of its packages, unpacked where they are imported from
    python3 -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" \
      "$work/site" .whl/*.whl
    notes+=(--note "pip failed (see the log): .whl/'s wheels were unpacked instead: $wheels.")
  fi
else
  notes+=(--note "No wheels in .whl/: the machine's own packages were used.")
fi
export PYTHONPATH="$work/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ ${#dry[@]} -gt 0 ]; then
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # toy sizes: threads that wait on each other's cores cost more
fi

left=$((budget - (SECONDS - started)))
timeout -k 5 "$left" python3 bench/gpu.py "$report" "${dry[@]}" --gpus "$gpus" --device-name "$name" \
  --budget $((left - 10)) --work "$work" "${notes[@]}"
status=$?
if [ $status -ne 0 ]; then
  echo -e "\n_The kit stopped with exit status $status ($((SECONDS - started)) s)._" >> "$report"
fi
echo "report: $report ($((SECONDS - started)) s)" >&2
exit $status
