export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
for tree in src old; do
  (cd .kwt/$tree; PYTHONPATH=$PWD timeout -k 5 -s INT 100 python bench/probe.py --specs gated_deltanet --T 8192 --top 16 --forward --out $OUT/probe_$tree 2>&1 | grep '^{')
done
