"""Where the host code beside this file finds its rendered kernels: `kernels(template, **render_args)`.

In lamixer the templates are rendered on first use and cached on disk (lamixer.render). A compiled
package has a loader.py of its own here instead, which imports the modules rendered beside it:
every other module of this folder is copied into packages verbatim.
"""
from ..render.kernel_cache import kernels

__all__ = ["kernels"]
