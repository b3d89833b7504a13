import dataclasses
import os
import sys

bt = int(os.environ.get("BT", "0"))
if bt:  # every chunk_additive group at BT-token chunks, the rest of its configuration as chosen
    import lamixer.tuning.choose as ch
    orig = ch.choose

    def patched(group, *a, **k):
        c = orig(group, *a, **k)
        return dataclasses.replace(c, BT=bt) if group.train.template == "chunk_additive" else c
    ch.choose = patched
from lamixer.tools.cli import main  # noqa: E402

sys.argv[0] = "lamixer"
main()
