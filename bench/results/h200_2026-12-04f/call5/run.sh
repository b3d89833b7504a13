cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
timeout -k 5 -s INT 60 python bench/block_attention.py --T 4096 --out $OUT/ba 2>&1 | grep -v Warn | tail -6
timeout -k 5 -s INT 60 python ba_sweep.py 2>&1 | tail -9
timeout -k 5 -s INT 90 python bench/probe.py --specs lln --T 4096 --out $OUT/probe_new 2>&1 | tail -32
