cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 60 python bench/block_attention.py --T 4096,8192 --out $OUT/ba 2>&1 | tail -8
timeout -k 5 -s INT 100 python /tmp/L.py bench lln --vs sdpa --lengths 2048,4096,8192,16384 --no-decode --out $OUT/lln_new 2>&1 | grep -A20 "┃ op"
cd ../old; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_old PYTHONPATH=$PWD
timeout -k 5 -s INT 70 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/lln_old 2>&1 | grep -A12 "┃ op"
