cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 60 python ba_sweep.py 2>&1 | tail -7
timeout -k 5 -s INT 60 python bench/block_attention.py --T 4096 --out $OUT/ba 2>&1 | grep -v Warn | tail -4
timeout -k 5 -s INT 100 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/lln_new 2>&1 | grep -A12 "┃ op"
