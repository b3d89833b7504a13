[ -f /tmp/tcache/.fla2 ] || { tar xzf .kwt/fla2.tgz -C /tmp/tcache; touch /tmp/tcache/.fla2; }
cd .kwt/src; export TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src PYTHONPATH=$PWD
pr() { timeout -k 5 -s INT $1 python bench/probe.py --specs $2 --T $3 --top 8 $4 --out $OUT/probe_$2_$3 2>&1 | grep '^{' | python -c "
import sys,json
for l in sys.stdin:
    d=json.loads(l); print(d.get('op'), d.get('config'), d.get('fwd_ms'), d.get('fwdbwd_ms')); print(' F', {k[:45]:v for k,v in (d.get('forward_kernels_us') or {}).items()}); print(' B', {k[:45]:v for k,v in (d.get('kernels_us') or {}).items() if 'chunk' in k})"; }
pr 120 simple_gla 16384 '--configs 64,128,128,4,3,64,64,8;64,128,128,4,3,32,64,8;64,128,64,4,3,64,64,8;64,128,64,4,3,32,64,8;64,128,128,4,3,16,64,8'
pr 80 simple_gla 2048 '--fla --forward'
printf '%s\n' 'import sys' 'from lamixer.tools.cli import main' "sys.argv[0]='lamixer'" 'main()' > /tmp/L.py
timeout -k 5 -s INT 70 python /tmp/L.py bench lln --vs sdpa --lengths 8192,16384 --no-decode --out $OUT/lln 2>&1 | grep -A8 "┃ op"
