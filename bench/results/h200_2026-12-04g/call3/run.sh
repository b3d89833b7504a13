cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 150 python ../../bench/results/h200_2026-12-04g/call3/host2.py 4096 2>&1 | grep -v Warn | cut -c1-230
