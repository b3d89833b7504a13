export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
cd .kwt/src; export PYTHONPATH=$PWD
timeout -k 5 -s INT 80 python bench/kernel_variants.py --variants bench/results/h200_2026-12-04b/variants_knorm.json --out $OUT/gdn 2>&1 | grep '^{'
timeout -k 5 -s INT 70 python bench/kernel_variants.py --decay key --variants bench/results/h200_2026-12-04b/variants_knorm_kda.json --out $OUT/kda 2>&1 | grep '^{'
echo "== probe branch"; timeout -k 5 -s INT 90 python bench/probe.py --specs gated_deltanet --T 8192 --top 14 --forward --out $OUT/probe_branch 2>&1 | tail -18
cd ../old; export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_old
echo "== probe main"; timeout -k 5 -s INT 90 python bench/probe.py --specs gated_deltanet --T 8192 --top 14 --forward --out $OUT/probe_main 2>&1 | tail -18
