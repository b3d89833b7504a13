cd .kwt/exp  # .kwt/src with the WW/SS patch (../env_patch.md); export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_exp PYTHONPATH=$PWD
for e in "WW=4 SS=3" "WW=2 SS=3" "WW=8 SS=3" "WW=4 SS=4" "WW=4 SS=2"; do
for s in linear_attn simple_gla; do
env $e timeout -k 5 -s INT 40 python bench/probe.py --specs $s --T 16384 --forward --top 3 --out $OUT/p_$s_${e// /_} 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print('$e', '$s', d.get('fwd_ms'), {k[:45]:v for k,v in (d.get('forward_kernels_us') or {}).items() if 'state' in k})"
done; done
