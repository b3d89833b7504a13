cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 150 python ba_sweep.py 2>&1 | grep -v Warn | tail -24
