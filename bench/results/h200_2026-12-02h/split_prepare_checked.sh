# The per-key decay's prepare kernel checking for non-finite values before its selects, one block per program; the other
# decays' prepare one program per chunk again: the new tree's probe, then its GPU check of the delta specs.
set -u
python -m pip install --no-deps -q .whl/*.whl 2>/dev/null
export TRITON_CACHE_DIR=/tmp/tcache TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src
mkdir -p /tmp/tcache && tar xzf .kwt/src/bench/results/h200_2026-12-02f/autotune.tgz -C /tmp/tcache 2>/dev/null
cd .kwt/src && export PYTHONPATH=$PWD
timeout -k 5 -s INT 150 python bench/probe.py --specs kda,gated_deltanet --forward --top 10 --out $OUT/src > $OUT/src.log 2>&1; echo "src rc $?" >> $OUT/rc.log
timeout -k 5 -s INT 300 python bench/gpu.py --specs kda,gated_deltanet,gated_deltaproduct,deltanet --skip-time --out $OUT/check > $OUT/check.log 2>&1; echo "check rc $?" >> $OUT/rc.log
