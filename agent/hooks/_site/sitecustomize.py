"""fleetprof: switches on the framework hooks of a job started by `fleetprof run`, with no change to its code.

`fleetprof run` prepends this folder to the child's PYTHONPATH, so Python runs this file at start-up in
place of any other `sitecustomize`. It then:
  1. runs the sitecustomize that would have run without us (the next one on sys.path), if any;
  2. puts a finder on `sys.meta_path` that waits for `import torch`, `import keras` and `import jax`: a program
     that imports none of them pays a few stat() calls and imports nothing of ours;
  3. after one of them has finished importing, imports its hooks (`agent.hooks.torch`, `.keras`, `.jax`) and
     installs them. Keras imports torch (its torch backend) and jax (whenever installed) itself: the torch hooks
     it brings in do not announce the job (Keras's do), count only a loop of the user's own and stand down in
     `Model.fit`; the JAX hooks announce nothing before a step of their own.
Nothing here may break the user's program: every failure is logged once and the program carries on.
"""

import contextlib
import sys


def _log_warning(msg, *args):
    import logging

    logging.getLogger("agent.hooks").warning(msg, *args)


def _chain_previous(here):
    import importlib.machinery
    import importlib.util
    import os

    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_fleetprof_chained_sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # as site.py does for a failing sitecustomize: report and go on
        _log_warning("fleetprof: the pre-existing sitecustomize %s failed: %r", spec.origin, exc)


def _import_hooks(root, target="agent.hooks.torch"):
    """Import the hooks module `target` from `root` even if the user's program has a module named `agent`."""
    import importlib
    import importlib.machinery
    import os

    ours = os.path.join(root, "agent", "__init__.py")
    existing = sys.modules.get("agent")
    if existing is not None:
        if os.path.abspath(getattr(existing, "__file__", "") or "") != ours:
            _log_warning("fleetprof hooks: a different module named 'agent' is already imported; hooks off")
            return None
        return importlib.import_module(target)
    spec = importlib.machinery.PathFinder.find_spec("agent", sys.path)
    shadowed = spec is not None and os.path.abspath(spec.origin or "") != ours
    sys.path.insert(0, root)
    try:
        module = importlib.import_module(target)
    finally:
        sys.path.remove(root)
    if shadowed:
        # The user's own `agent` must win their later `import agent`: our modules keep working through the
        # references they already hold (agent.hooks.torch imports all it needs at import time).
        for name in [n for n in sys.modules if n == "agent" or n.startswith("agent.")]:
            del sys.modules[name]
    return module


WATCHED = ("torch", "keras", "jax")


def _on_imported(root, name):
    try:
        hooks = _import_hooks(root, "agent.hooks." + name)
        if hooks is None:
            return
        if name == "torch" and "keras" in sys.modules:
            # keras is importing its torch backend: its hooks announce the job; torch's keep to a loop of the
            # user's own (a torch optimizer stepping a Keras model) and stand down in Model.fit
            hooks.install(announce=False)
        else:
            hooks.install()
    except Exception as exc:
        _log_warning("fleetprof hooks: not installed: %r", exc)


class _ImportWatcher:
    """Meta-path finder: wraps the loader of each watched top-level module once, so that its hooks install right
    after it loads; it leaves sys.meta_path once all of them have been seen."""

    def __init__(self, root, names):
        self.root = root
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names:
            return None
        self.names.discard(fullname)
        if not self.names:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self)
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
            loader = getattr(spec, "loader", None)
            original = getattr(loader, "exec_module", None)
            if loader is None or original is None:
                return spec
            root = self.root

            def exec_module(module):
                try:
                    original(module)
                finally:
                    with contextlib.suppress(AttributeError):
                        del loader.exec_module
                _on_imported(root, fullname)

            loader.exec_module = exec_module
            return spec
        except Exception as exc:
            _log_warning("fleetprof hooks: not installed: %r", exc)
            return None  # let the normal finders import it untouched


def _boot():
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        _chain_previous(here)
    except Exception as exc:
        _log_warning("fleetprof: could not chain the pre-existing sitecustomize: %r", exc)
    try:
        root = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # .../<root>/agent/hooks/_site
        for name in ("torch", "jax", "keras"):
            if name in sys.modules:
                _on_imported(root, name)
        pending = [name for name in WATCHED if name not in sys.modules]
        if pending:
            sys.meta_path.insert(0, _ImportWatcher(root, pending))
    except Exception as exc:
        _log_warning("fleetprof hooks: not installed: %r", exc)


_boot()
