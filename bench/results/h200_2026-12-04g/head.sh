# Sourced before each call's run.sh on the device (from the repository root, the tree snapshotted to .kwt/src, the old
# tree to .kwt/old, lark and FLA's wheels in .whl): the wheels, one Triton cache for the run, FLA's autotune choices.
python -m pip install --no-deps -q .whl/*.whl 2>/dev/null
export TRITON_CACHE_DIR=/tmp/tcache; mkdir -p /tmp/tcache
[ -f /tmp/tcache/.fla3 ] || { tar xzf .kwt/fla3.tgz -C /tmp/tcache; touch /tmp/tcache/.fla3; }  # .kwt/fla3.tgz: call2's, then call4's fla_autotune_all.tgz
printf '%s\n' 'import sys' 'from lamixer.tools.cli import main' "sys.argv[0]='lamixer'" 'main()' > /tmp/L.py
