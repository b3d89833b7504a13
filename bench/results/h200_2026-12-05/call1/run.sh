nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
cd .kwt/src; export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
echo "== check (new)"; timeout -k 5 -s INT 110 python /tmp/L.py check lln examples/specs/gla_normalized.lam --device cuda 2>&1 | grep -v Warn | tail -6
echo "== bench lln (new)"; timeout -k 5 -s INT 100 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/new 2>&1 | grep -v Warn | tail -10
cd ../old; export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_old
echo "== bench lln (old 03e83b0)"; timeout -k 5 -s INT 100 python /tmp/L.py bench lln --vs sdpa --lengths 4096,8192 --no-decode --out $OUT/old 2>&1 | grep -v Warn | tail -10
echo "== block attention (old)"; timeout -k 5 -s INT 45 python bench/block_attention.py --T 4096 2>&1 | grep -v Warn | tail -6
cd ../src; export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
echo "== block attention (new)"; timeout -k 5 -s INT 45 python bench/block_attention.py --T 4096 2>&1 | grep -v Warn | tail -6
echo "== probe lln (new)"; timeout -k 5 -s INT 100 python bench/probe.py --specs lln --T 4096 --forward --top 20 --out $OUT/probe 2>&1 | grep -v Warn | tail -40
