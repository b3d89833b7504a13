cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 60 python bench/block_attention.py --T 4096,16384 --out $OUT/ba 2>&1 | grep -v Warn | tail -7
timeout -k 5 -s INT 110 python /tmp/L.py bench lln --vs sdpa --lengths 2048,4096,8192,16384 --no-decode --out $OUT/lln_new 2>&1 | grep -A20 "┃ op"
timeout -k 5 -s INT 90 python /tmp/L.py bench linear_attn --vs fla --lengths 2048,16384 --no-decode --out $OUT/linear_attn 2>&1 | grep -A12 "┃ op"
