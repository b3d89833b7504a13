cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 100 python bench/kernel_variants.py --variants bench/results/h200_2026-12-04b/variants_grad.json --out $OUT/grad 2>&1 | grep '^{'
timeout -k 5 -s INT 200 python /tmp/L.py bench kda gated_deltanet --vs fla --lengths 8192,16384 --no-decode --out $OUT/bench_long 2>&1 | grep -A30 "┃ op"
