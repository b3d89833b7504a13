cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 80 python /tmp/L.py bench linear_attn --vs fla --lengths 2048,4096,8192,16384 --no-decode --out $OUT/linear_attn 2>&1 | grep -A18 "┃ op"
timeout -k 5 -s INT 170 python /tmp/L.py bench gla --vs fla --lengths 2048,8192 --no-decode --out $OUT/gla 2>&1 | grep -A18 "┃ op"
(cd /tmp/tcache && find . -name "*.autotune.json" | tar czf $OUT/fla_autotune_all.tgz -T -)
