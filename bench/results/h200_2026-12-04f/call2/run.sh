cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 90 python /tmp/L.py bench mamba2 --vs fla --lengths 2048,8192 --no-decode --out $OUT/mamba2 2>&1 | grep -A18 "┃ op"
for d in none constant; do timeout -k 5 -s INT 50 python bench/kernel_variants.py --family additive --decay $d --T 16384 --variants wadd.json --out $OUT/add_$d 2>&1 | tail -30; done
timeout -k 5 -s INT 60 python bench/kernel_variants.py --family delta --decay key --T 16384 --variants wdelta.json --out $OUT/delta_key 2>&1 | tail -30
(cd /tmp/tcache && find . -name "*.autotune.json" | tar czf $OUT/fla_autotune_all.tgz -T -)
