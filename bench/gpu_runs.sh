#!/usr/bin/env bash
# The GPU-host runs of issue 18, one section per run, for the device tool's
# hosts. From the project root, after `. .gl/setup.sh` (see DEVELOPERS/README):
#
#   bash bench/gpu_runs.sh [--logical-pair] SECTION...
#
# SECTION: suite (or its halves suite_a, suite_b) wave1 placement k2k migration scaling (issue 18's runs), reload_gaps (issue 25's reload goal),
# nvlink_k2k stencil_scaling nvlink_migration (issue 27's runs 1-3, for hosts
# of two or more GPUs; `scaling` on four), or all. Every
# command's output goes to $OUT/NAME.txt (JSON figures to $OUT/NAME.json where
# the bench writes one); at the end everything is packed into $OUT/runs.tgz
# (the device tool brings at most a few files back). `--logical-pair` first
# makes two logical devices of one GPU (two copies of the driver manifest): a
# functional pair on the real driver, not a two-GPU performance figure.
# Per-command limits keep one hung command from eating the call.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-runs}
RUNS=$OUT/runs
mkdir -p "$RUNS"

if [ "${1:-}" = "--logical-pair" ]; then
    shift
    f=${VK_DRIVER_FILES%%:*}
    cp "$f" /tmp/icd_copy2.json
    export VK_DRIVER_FILES="$f:/tmp/icd_copy2.json"
fi
[ $# -gt 0 ] || set -- all
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)

run() {   # run NAME LIMIT_S COMMAND...: time-limited, output kept, the rc noted
    local name=$1 limit=$2
    shift 2
    echo "+ $*" > "$RUNS/$name.txt"
    local t0=$SECONDS
    timeout "$limit" "$@" >> "$RUNS/$name.txt" 2>&1
    local rc=$?
    { echo "$name: rc=$rc in $((SECONDS - t0)) s"; tail -n 2 "$RUNS/$name.txt" | cut -c1-400; } \
        | tee -a "$RUNS/summary.txt"
}

# The GPU suite in two halves (test files a-k, then l-z), each well inside one call's 600 s: the
# whole suite takes 450-480 s on 15 workers, and a run cut off by its limit names no failure.
suite_half() {   # suite_half NAME FILE...
    local name=$1
    shift
    run "$name" 540 env VKMULTI_REAL_GPUS=1 VKMULTI_SKIP_CLUSTER=1 python3 -m pytest -q -p no:cacheprovider \
        -p no:benchmark -n 15 -o console_output_style=classic -rfEs "$@"
}
suite_a() { suite_half suite_a tests/test_[a-k]*.py; }
suite_b() { suite_half suite_b tests/test_[l-z]*.py; }
suite() { suite_a; suite_b; }

wave1() {
    run transfer 240 python3 bench/transfer.py --reps 30 --no-torch --json "$RUNS/transfer.json"
    [ "$gpus" -ge 2 ] && run cuda_peer 180 python3 bench/cuda_peer.py --reps 30 --no-torch --json "$RUNS/cuda_peer.json"
    run buffers 180 python3 bench/buffers.py --reps 10 --json "$RUNS/buffers.json"
    run demo_heavy 240 python3 -m vkmulti demo --heavy --json --output ''
}

placement() {
    nvidia-smi topo -m > "$RUNS/nvidia_smi_topo.txt" 2>&1
    run topology 180 env VKMULTI_CACHE_DIR=/tmp/vkm-topo python3 -m vkmulti topology --measure --json
    run adaptive 300 python3 bench/placement.py --section adaptive --heavy
    run strategies 120 python3 bench/placement.py --section strategies
}

k2k() {
    run k2k 300 python3 bench/k2k.py --json "$RUNS/k2k.json"
    # the same bandwidth rows with every batch copied into the inbox (no in-place reading), to compare
    run k2k_copy 200 python3 bench/k2k.py --section bandwidth --no-in-place --json "$RUNS/k2k_copy.json"
    run demo_stencil 240 python3 -m vkmulti demo stencil --heavy --json --output "$RUNS/stencil.png"
}

migration() {
    run migration 300 python3 bench/migration.py --json "$RUNS/migration.json"
    run drill_frames 300 python3 -m vkmulti demo --lose-gpu 1@50 --frames 100 --output ''
    run drill_stencil 300 python3 -m vkmulti demo stencil --steps 200 --lose-gpu 1@100 --output ''
}

# Issue 25's reload goal: the bench's reload section, then where a reload's longest gaps come from
# (bench/probes/reload_gaps.py: the parts of the steps before them and the jobs beside them).
reload_gaps() {
    run reload 200 python3 bench/migration.py --section reload --repeats 5 --json "$RUNS/reload.json"
    run reload_gaps 200 python3 bench/probes/reload_gaps.py cold warm prebuilt cold warm prebuilt solo
}

scaling() {   # run 5 (nvidia-h200-x4): the SRU demo and the stencil on 1..N GPUs
    local n devs=0
    for ((n = 1; n <= gpus; n++)); do
        [ "$n" -gt 1 ] && devs="$devs,$((n - 1))"
        run "demo_${n}gpu" 240 python3 -m vkmulti demo --heavy --json --devices "$devs" --output ''
        run "stencil_${n}gpu" 240 python3 -m vkmulti demo stencil --heavy --json --devices "$devs" --output ''
    done
}

# Issue 27, run 1: K2K between kernels on GPU 0 and GPU 1 over the pair's best method (NVLink where
# there is one), then the bandwidth rows up to 256 MiB over cuda_peer and host_shared; each with the
# floor, the raw transfer and the host's time per step measured in the same run.
nvlink_k2k() {
    run k2k_latency 200 python3 bench/k2k.py --section latency --hops 200 --rounds 5 --json "$RUNS/k2k_latency.json"
    for m in cuda_peer host_shared; do
        run "k2k_bw_$m" 400 python3 bench/k2k.py --section bandwidth --max 256M --method "$m" --rounds 3 \
            --json "$RUNS/k2k_bw_$m.json"
    done
}

# Issue 27, run 2: the heavy stencil on 1 .. N GPUs, every field checked identical, the speed-up
# plotted against the GPU count (copy stencil_scaling.png into bench/ with the figures).
stencil_scaling() {
    run stencil_scaling 1500 python3 bench/scaling.py --heavy --json "$RUNS/stencil_scaling.json" \
        --plot "$RUNS/stencil_scaling.png"
}

# Issue 27, run 3: a 16 MiB kernel state moved GPU -> GPU (copy phase, end to end, first move, against
# the raw copy of its bytes), then the lost-GPU drills of the frames demo and the stencil.
nvlink_migration() {
    run nvlink_migration 300 python3 bench/migration.py --section migrate --sizes 16M --repeats 9 \
        --json "$RUNS/nvlink_migration.json"
    run nvlink_drill 300 python3 bench/migration.py --section drill --json "$RUNS/nvlink_drill.json"
    run nvlink_drill_frames 300 python3 -m vkmulti demo --lose-gpu 1@50 --frames 100 --output ''
    run nvlink_drill_stencil 300 python3 -m vkmulti demo stencil --steps 200 --lose-gpu 1@100 --output ''
}

for section in "$@"; do
    case "$section" in
        all) suite; wave1; placement; k2k; migration; [ "$gpus" -ge 3 ] && scaling
             [ "$gpus" -ge 2 ] && { nvlink_k2k; stencil_scaling; nvlink_migration; } ;;
        suite|suite_a|suite_b|wave1|placement|k2k|migration|reload_gaps|scaling|nvlink_k2k|stencil_scaling|nvlink_migration)
            "$section" ;;
        *) echo "gpu_runs.sh: unknown section $section (suite suite_a suite_b wave1 placement k2k migration reload_gaps scaling" \
                "nvlink_k2k stencil_scaling nvlink_migration all)" >&2; exit 2 ;;
    esac
done
tar -C "$OUT" -czf "$OUT/runs.tgz" runs && rm -rf "$RUNS"
echo "gpu_runs.sh: $OUT/runs.tgz"
