cd .kwt/old; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_old PYTHONPATH=$PWD
timeout -k 5 -s INT 80 python bench/block_attention.py --T 4096 --out $OUT/ba_head 2>&1 | grep -v Warn | tail -5
cd ../src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 80 python bench/block_attention.py --T 4096 --out $OUT/ba_prefetch 2>&1 | grep -v Warn | tail -5
cd ../old; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_old PYTHONPATH=$PWD
timeout -k 5 -s INT 100 python /tmp/L.py bench lln --vs sdpa --lengths 4096 --no-decode --out $OUT/lln 2>&1 | grep -A6 "┃ op"
