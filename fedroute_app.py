"""The Flower components of fedroute, run from the app's own files (the FAB).

``pyproject.toml`` names ``fedroute_app:serverapp`` and ``fedroute_app:clientapp``.
The repository root *is* the package ``fedroute``, but a FAB is extracted
under a directory named after its hash (``$FLWR_HOME/apps/fedroute.fedroute.
<version>.<hash>/``), from which ``import fedroute`` finds nothing.  Imported
there as the top-level module ``fedroute_app``, this module registers its own
directory as the package ``fedroute`` (a finder first on ``sys.meta_path``), so
every ``fedroute.*`` import of the components comes from the FAB's files:
no pre-installed fedroute is needed, and a code change in the FAB reaches every
SuperNode.

Another fedroute installed where the components run (e.g. ``pip install -e .``
of a checkout, as the README's install does) is *not* used by them: the FAB's
files win, in every process that imports this module, and an earlier-imported
``fedroute`` is dropped from ``sys.modules``.  A ``fedroute`` module missing
from the FAB fails to import rather than falling back to the installed copy.
Imported as ``fedroute.fedroute_app`` (from an installed package) it registers
nothing.

The two attributes import lazily: a ClientApp process (one per message in a
deployment) never imports the server's modules, nor the server the client's.

Flower's Ray simulation loads the ClientApp once in the simulation process and
sends the object to its Ray workers by pickle, where its functions would be
imported by module name (``fedroute.client.app``) from the workers' own path:
an installed fedroute, or the working directory of the SuperLink (the folder of
whichever ``flwr run`` started it), never the FAB.  The component therefore
pickles as "load me from these app files" (:func:`component`), so the workers
run the FAB's code too.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Sequence

__all__ = ["serverapp", "clientapp", "PACKAGE", "component", "register_package"]

PACKAGE = "fedroute"
ROOT = Path(__file__).resolve().parent

_COMPONENTS = {"serverapp": "fedroute.server.app", "clientapp": "fedroute.client.app"}


class PackageDirectoryFinder(importlib.abc.MetaPathFinder):
    """Finds ``fedroute`` and ``fedroute.*`` in one directory only (the FAB's), before any other finder."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        location = self.root.joinpath(*fullname.split(".")[1:])
        if (location / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(fullname, location / "__init__.py",
                                                          submodule_search_locations=[str(location)])
        if location.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(fullname, location.with_suffix(".py"))
        raise ModuleNotFoundError(f"No module named {fullname!r} in the Flower app at {self.root}", name=fullname)


def _loaded_from(root: Path) -> bool:
    module = sys.modules.get(PACKAGE)
    return module is not None and [str(root)] == list(getattr(module, "__path__", []))


def register_package(root: Path = ROOT) -> None:
    """Make ``root`` the package ``fedroute`` of this process (idempotent).

    Any other ``fedroute`` finder this module installed earlier is removed, and modules of a
    ``fedroute`` imported from elsewhere are dropped from ``sys.modules``, so the next import
    reads ``root``'s files.
    """
    # By class name: a finder of another FAB's copy of this module is another class of the same name.
    ours = [finder for finder in sys.meta_path if type(finder).__name__ == PackageDirectoryFinder.__name__]
    current = [finder for finder in ours if getattr(finder, "root", None) == root]
    sys.meta_path[:] = [finder for finder in sys.meta_path if finder not in ours or finder in current]
    if not current:
        sys.meta_path.insert(0, PackageDirectoryFinder(root))
    if PACKAGE in sys.modules and not _loaded_from(root):
        previous = getattr(sys.modules[PACKAGE], "__file__", None)
        for name in [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]:
            del sys.modules[name]
        logging.getLogger(PACKAGE).info("fedroute: using the Flower app's files in %s, not the fedroute "
                                        "imported before from %s", root, previous)


def _reduce_from_app_files(app: Any) -> tuple[Any, tuple[Any, ...]]:
    """Pickle a component as a call that loads it from its app files (by path, whatever the unpickler's
    ``sys.path``): ``runpy`` runs that directory's ``fedroute_app.py``, which registers the directory as
    ``fedroute``, and takes the component from it.  Only builtins are pickled by reference."""
    source = str(Path(app.fedroute_app_files) / "fedroute_app.py")
    expression = (f"__import__('runpy').run_path({source!r}, run_name='fedroute_app')"
                  f"['component']({app.fedroute_component!r})")
    return eval, (expression, {})


def component(name: str) -> Any:
    """``serverapp`` or ``clientapp`` of these app files, pickled as a reference to them (see the module doc)."""
    if name not in _COMPONENTS:
        raise AttributeError(f"module 'fedroute_app' has no attribute {name!r}")
    app = importlib.import_module(_COMPONENTS[name]).app
    if getattr(type(app), "fedroute_app_files", None) != str(ROOT):
        app.__class__ = type(type(app).__name__, (type(app),), {
            "fedroute_app_files": str(ROOT), "fedroute_component": name, "__reduce__": _reduce_from_app_files,
            "__module__": type(app).__module__, "__qualname__": type(app).__qualname__})
    return app


def __getattr__(name: str) -> Any:
    if name in _COMPONENTS:
        return component(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "fedroute_app":  # the FAB's (or the checkout's) top-level module, not fedroute.fedroute_app
    register_package()
