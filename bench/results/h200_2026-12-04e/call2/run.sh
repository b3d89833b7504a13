cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
for s in gla gsa; do timeout -k 5 -s INT 150 python /tmp/L.py bench $s --vs fla --lengths 2048,4096,8192,16384 --no-decode --out $OUT/$s 2>&1 | grep -A18 "┃ op"; done
(cd /tmp/tcache && find . -name "*.autotune.json" | tar czf $OUT/fla_autotune_all.tgz -T -)
