export PYTHONPATH=$PWD TORCHINDUCTOR_CACHE_DIR=/tmp/ind_src; python /tmp/L.py bench gla rwkv6 hgrn2 gsa deltanet --vs fla --no-decode --lengths 4096,16384 --out $OUT/bench_rest
