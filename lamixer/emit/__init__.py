"""Code generation for `lamixer compile`: a spec as a Python package that imports only torch (and triton).

    source.py   writing Python safely: identifiers, numbers, expressions spelled from runtime.ops
    mixer.py    the mixer module: the call and the kernel plan written out
    layer.py    the layer module: the layer section written out
    kernels.py  the Triton wiring: rendered kernels, their host code, scans.py
    package.py  the files of a package, or of several sharing one runtime
"""
