cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 170 python /tmp/L.py bench lln --vs sdpa --lengths 2048,4096,8192,16384 --no-decode --out $OUT/lln 2>&1 | grep -A12 "┃ op"
timeout -k 5 -s INT 100 python bench/probe.py --specs lln --T 4096 --forward --top 16 --out $OUT/probe 2>&1 | grep -v Warn | tail -3 | cut -c1-1500
export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_cd TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1
timeout -k 5 -s INT 150 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/lln_cd 2>&1 | grep -A8 "┃ op"
