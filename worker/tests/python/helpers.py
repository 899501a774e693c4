"""Loads the executor's embedded Python (worker/src/*.py, worker/src/checkpoint/*.py) as the kernel does: by path, as
private modules, with the vendored cloudpickle handed to the checkpoint code."""
import importlib.util
import pathlib
import sys
import types

WORKER = pathlib.Path(__file__).resolve().parents[2]


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def support():
    return load("_flowrepl", WORKER / "src" / "support.py")


# The checkpoint package in its load order (worker/src/support.rs, `CHECKPOINT`).
CHECKPOINT = ("picklable", "files", "graph", "restore", "store")


def load_with(name, path, globals_):
    """A module given `globals_` once its code has run, as the kernel's loader does."""
    module = load(name, path)
    for key, value in globals_.items():
        setattr(module, key, value)
    return module


def checkpoint():
    """The checkpoint package, each module by its short name (`store` is `_flowrepl_checkpoint`)."""
    cloudpickle = load("_flowrepl_cloudpickle", WORKER / "vendor" / "cloudpickle" / "cloudpickle.py")
    sys.modules.pop("_flowrepl_cloudpickle", None)
    loaded = {}
    for short in CHECKPOINT:
        name = "_flowrepl_checkpoint" if short == "store" else f"_flowrepl_checkpoint_{short}"
        module = load_with(name, WORKER / "src" / "checkpoint" / f"{short}.py", dict(loaded))
        if short == "picklable":
            module.cloudpickle = cloudpickle
        loaded[short] = module
    return types.SimpleNamespace(**loaded)
