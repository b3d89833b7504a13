cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 75 python /tmp/L.py bench linear_attn --vs fla --lengths 2048,8192,16384 --no-decode --out $OUT/linear_attn 2>&1 | grep -A14 "┃ op"
timeout -k 5 -s INT 45 python /tmp/L.py bench retnet --vs fla --lengths 16384 --no-decode --out $OUT/retnet 2>&1 | grep -A6 "┃ op"
