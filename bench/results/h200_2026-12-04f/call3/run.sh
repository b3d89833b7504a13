cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
for s in gla gsa; do timeout -k 5 -s INT 100 python /tmp/L.py bench $s --vs fla --lengths 4096,16384 --no-decode --out $OUT/$s 2>&1 | grep -A18 "┃ op"; done
timeout -k 5 -s INT 80 python bench/defaults_vs_tuned.py --specs linear_attn --lengths 2048,16384 --configs 64,128,128,4,2,64,32,4 64,128,128,4,3,64,32,4 --out $OUT/dvt_linear_attn.json 2>&1 | tail -20
(cd /tmp/tcache && find . -name "*.autotune.json" | tar czf $OUT/fla_autotune_all.tgz -T -)
