cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 60 python /tmp/L.py check lln 2>&1 | grep -v Warn | tail -1
timeout -k 5 -s INT 60 python bench/memory.py lln --cuda --B 4 --T 8192 --H 16 2>&1 | grep -v Warn | tail -1
timeout -k 5 -s INT 80 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/lln 2>&1 | grep -A6 "┃ op"
