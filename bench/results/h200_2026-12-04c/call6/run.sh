[ -f /tmp/tcache/.fla2 ] || { tar xzf .kwt/fla2.tgz -C /tmp/tcache; touch /tmp/tcache/.fla2; }
cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
for s in linear_attn retnet; do timeout -k 5 -s INT 100 python bench/probe.py --specs $s --T 2048 --top 8 --fla --forward --out $OUT/probe_$s 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print(d.get('op'), d.get('fwd_ms'), d.get('fwdbwd_ms'), d.get('forward_pace'), {k[:60]:v for k,v in (d.get('forward_kernels_us') or {}).items()})"; done
