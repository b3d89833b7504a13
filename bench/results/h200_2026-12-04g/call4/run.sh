cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 100 python /tmp/L.py check lln 2>&1 | grep -v Warn | tail -6
timeout -k 5 -s INT 100 python bench/memory.py lln --cuda --B 4 --T 8192 --H 16 --at-peak --top 14 2>&1 | grep -v Warn | tail -16
timeout -k 5 -s INT 120 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/lln_new 2>&1 | grep -A8 "┃ op"
cd ../old; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_old PYTHONPATH=$PWD
timeout -k 5 -s INT 100 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/lln_old 2>&1 | grep -A8 "┃ op"
cd ../src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 60 python bench/block_attention.py --T 4096 2>&1 | grep -v Warn | tail -8
