# The delta rule's solve split (and a per-key decay's scores kept), before (src_old) and after (src), each tree with its
# own inductor cache (a compiled backward of the old op schema must not be reused), then the new tree's GPU check.
set -u
python -m pip install --no-deps -q .whl/*.whl 2>/dev/null
export TRITON_CACHE_DIR=/tmp/tcache
mkdir -p /tmp/tcache && tar xzf .kwt/src/bench/results/h200_2026-12-02f/autotune.tgz -C /tmp/tcache 2>/dev/null
for tree in src_old src; do
  (cd .kwt/$tree && TORCHINDUCTOR_CACHE_DIR=/tmp/ind_$tree PYTHONPATH=$PWD timeout -k 5 -s INT 170 python bench/probe.py --specs kda,gated_deltanet,deltanet --forward --top 10 --out $OUT/$tree > $OUT/$tree.log 2>&1; echo "$tree rc $?" >> $OUT/rc.log)
done
(cd .kwt/src && TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD timeout -k 5 -s INT 200 python bench/gpu.py --specs kda,rwkv7,gated_deltanet --skip-time --out $OUT/check > $OUT/check.log 2>&1; echo "check rc $?" >> $OUT/rc.log)
