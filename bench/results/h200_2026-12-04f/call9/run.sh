cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 60 python ba_sweep2.py 2>&1 | grep -v Warn | tail -6
timeout -k 5 -s INT 90 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/lln_new 2>&1 | grep -A12 "┃ op"
