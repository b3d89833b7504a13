cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout -k 5 -s INT 120 python bench/memory.py lln --cuda --B 4 --T 8192 --H 16 --at-peak --top 30 2>&1 | grep -v Warn | tail -34
timeout -k 5 -s INT 150 python bench/probe.py --specs lln --T 4096 --forward --top 20 --out $OUT/probe 2>&1 | grep -v Warn | tail -70
