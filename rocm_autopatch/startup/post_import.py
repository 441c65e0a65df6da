"""Post-import hooks: run a callback right after a named module finishes executing.

A small meta-path finder in the style of wrapt's ``importer`` (stdlib only, because it
is loaded at interpreter start). For a watched name it asks the finders behind it for
the real spec and wraps that spec's loader so the callback fires after ``exec_module``.
Every other import costs one dict lookup. Callbacks are named as ``"pkg.mod:func"``
strings and imported only when they fire, so nothing of ours loads before torch does.
"""

import _thread
import sys
from time import perf_counter

TYPE_CHECKING = False  # typing/threading cost ~11 ms at start-up; annotations are strings
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable, Dict, List, Optional, Sequence

    Callback = Callable[[ModuleType], None]

_state = _thread._local()


def _resolve(target: str) -> "Callback":
    module_name, _, func_name = target.partition(":")
    __import__(module_name)
    return getattr(sys.modules[module_name], func_name)


def _report_failure(name: str, target: str, exc: BaseException) -> None:
    """Last line of defence: a hook must never break the user's import."""
    try:
        from rocm_autopatch import log

        log.hook_failed(name, target, exc)
    except Exception:  # noqa: BLE001 - the recorder itself failed; say so and go on
        import _rocm_autopatch_start

        _rocm_autopatch_start.say(f"rocm-autopatch: WARNING: hook {target} for {name} "
                                  f"failed: {exc!r}\n")


# Seconds spent in each callback, our modules' imports included (doctor, benchmarks).
timings: "Dict[str, float]" = {}
# What a callback returns when its module is not complete yet: it is asked again later. A
# module loaded through ``importlib.util.LazyLoader`` runs its body at its first attribute
# access, and looks imported (in sys.modules, not initialising) before it has.
LATER = "later"


def fire(name: str, module: "ModuleType", targets: "Sequence[str]") -> "List[str]":
    """Run each callback for ``module``; a failing one is recorded, the rest still run.
    The callbacks that answered ``LATER``."""
    later = []
    for target in targets:
        start = perf_counter()
        try:
            if _resolve(target)(module) == LATER:
                later.append(target)
        except Exception as exc:  # noqa: BLE001 - see _report_failure
            _report_failure(name, target, exc)
        finally:
            timings[target] = timings.get(target, 0.0) + perf_counter() - start
    return later


class _HookedLoader:
    """Wraps a real loader; restores it on the module, then fires the hooks after exec."""

    def __init__(self, loader: "Any", finder: "PostImportFinder", name: str) -> None:
        self._loader = loader
        self._finder = finder
        self._name = name

    def __getattr__(self, attr: str) -> "Any":  # get_source, get_resource_reader, ...
        return getattr(self._loader, attr)

    def create_module(self, spec: "Any") -> "Optional[ModuleType]":
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: "ModuleType") -> None:
        # The module must see its real loader (inspect, importlib.resources, pickling).
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._loader.exec_module(module)
        self._finder.module_loaded(self._name, sys.modules.get(self._name, module))


class PostImportFinder:
    """Watches the modules in ``hooks``. One per process (``bootstrap.activate``), reached
    through the start-up trigger that sits in ``sys.meta_path``.

    A module can be *deferred* instead of watched: its loader is left alone (its import
    runs with no frame of ours; a failing import looks as it does without us) and its
    hooks fire when something says it is loaded (``fire_deferred(force=True)``: torch's
    backend autoload calls us at the end of ``import torch``), or at the first import
    request after it has finished importing."""

    def __init__(self, hooks: "Dict[str, Sequence[str]]") -> None:
        self.hooks = dict(hooks)
        self.deferred: "Dict[str, Sequence[str]]" = {}  # noqa: UP037 - typing not imported

    def real_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        """The spec the finders behind us give ``fullname``; None where there is none."""
        busy = getattr(_state, "busy", None)
        if busy is None:
            busy = _state.busy = set()
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            trigger = getattr(sys, "_rocm_autopatch", None)
            for finder in list(sys.meta_path):
                # We answer through the start-up trigger, not from sys.meta_path: skip it.
                if finder is trigger or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
        finally:
            busy.discard(fullname)
        return None

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        if self.deferred:
            self.fire_deferred()
        if fullname not in self.hooks:
            return None
        return self.watch(fullname, self.real_spec(fullname, path, target))

    def watch(self, fullname: str, spec: "Any") -> "Any":
        """``spec`` with its loader wrapped so that ``fullname``'s hooks fire after it runs."""
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, self, fullname)
        return spec

    def defer(self, fullname: str) -> None:
        targets = self.hooks.pop(fullname, None)
        if targets is not None:
            self.deferred[fullname] = targets

    def fire_deferred(self, force: bool = False) -> None:
        """Fire the hooks of deferred modules that are in ``sys.modules`` and have finished
        importing (or are importing, with ``force``: the module itself called us)."""
        for name in list(self.deferred):
            module = sys.modules.get(name)
            spec = getattr(module, "__spec__", None)
            if module is None or (not force and getattr(spec, "_initializing", False)):
                continue
            targets = self.deferred.pop(name, None)
            if targets is not None:
                later = fire(name, module, targets)
                if later:
                    self.deferred[name] = later

    def module_loaded(self, name: str, module: "ModuleType") -> None:
        fire(name, module, self.hooks.get(name, ()))

    def fire_already_imported(self) -> None:
        """Modules imported before we were installed (another .pth got there first)."""
        for name, targets in list(self.hooks.items()):
            module = sys.modules.get(name)
            if module is not None:
                later = fire(name, module, targets)
                if later:
                    self.deferred[name] = later


def deactivate(finder: "Optional[PostImportFinder]") -> None:
    """Stop watching anything: used when torch turns out not to be a ROCm build.

    The finder is emptied, not removed: another thread may be walking ``sys.meta_path``.
    """
    if finder is not None:
        finder.hooks = {}
        finder.deferred = {}
