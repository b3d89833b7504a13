cd .kwt/exp  # .kwt/src with the WW/SS patch (../env_patch.md); export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_exp PYTHONPATH=$PWD
for c in "linear_attn 2048" "linear_attn 8192" "retnet 16384" "lln 8192"; do set -- $c
for e in "WW=4 SS=3" "WW=4 SS=4"; do
env $e timeout -k 5 -s INT 40 python bench/probe.py --specs $1 --T $2 --forward --top 3 --out $OUT/p 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print('$e', '$1', '$2', d.get('fwd_ms'), {k[:45]:v for k,v in (d.get('forward_kernels_us') or {}).items() if 'state' in k})"
done; done
