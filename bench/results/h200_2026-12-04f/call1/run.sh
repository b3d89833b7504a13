cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 200 python /tmp/L.py bench rwkv6 --vs fla --lengths 2048,8192 --no-decode --out $OUT/rwkv6 2>&1 | grep -A18 "┃ op"
timeout -k 5 -s INT 90 python /tmp/L.py bench hgrn2 --vs fla --lengths 2048,8192 --no-decode --out $OUT/hgrn2 2>&1 | grep -A18 "┃ op"
(cd /tmp/tcache && find . -name "*.autotune.json" | tar czf $OUT/fla_autotune_all.tgz -T -)
