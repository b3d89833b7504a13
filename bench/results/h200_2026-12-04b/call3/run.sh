cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 100 python bench/kernel_variants.py --decay key --variants bench/results/h200_2026-12-04b/variants_kda_output.json --out $OUT/kda 2>&1 | grep '^{'
timeout -k 5 -s INT 40 python bench/kernel_variants.py --T 2048 --out $OUT/gdn2048 2>&1 | grep '^{'
