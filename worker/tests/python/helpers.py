"""Loads the executor's embedded Python (worker/src/*.py) as the kernel does: by path, as
private modules, with the vendored cloudpickle handed to the checkpoint code."""
import importlib.util
import pathlib
import sys

WORKER = pathlib.Path(__file__).resolve().parents[2]


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def support():
    return load("_flowrepl", WORKER / "src" / "support.py")


def snapshot():
    module = load("_flowrepl_snapshot", WORKER / "src" / "snapshot.py")
    module._cloudpickle = load("_flowrepl_cloudpickle", WORKER / "vendor" / "cloudpickle" / "cloudpickle.py")
    sys.modules.pop("_flowrepl_cloudpickle", None)
    return module
