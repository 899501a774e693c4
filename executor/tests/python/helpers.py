"""Loads the executor's embedded Python packages (executor/src/support/, executor/src/checkpoint/)
as the kernel does: by path, as private modules in the order executor/src/support.rs declares
(read from there), each given the ones before it, with the vendored cloudpickle handed to the
checkpoint code."""
import importlib.util
import pathlib
import re
import sys
import types

WORKER = pathlib.Path(__file__).resolve().parents[2]


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _declared():
    """folder -> (module prefix, short names in load order), from support.rs's `package!`s."""
    text = (WORKER / "src" / "support.rs").read_text()
    found = {}
    for prefix, folder, names in re.findall(r'package!\(\s*"(\w+)",\s*"(\w+)":([^)]*)\)', text):
        found[folder] = (prefix, re.findall(r'"(\w+)"', names))
    return found


def package(folder):
    """A package as the kernel loads it: each module given the ones before it by short name."""
    prefix, order = _declared()[folder]
    loaded = {}
    for short in order:
        module = load_with(f"{prefix}_{short}", WORKER / "src" / folder / f"{short}.py", dict(loaded))
        loaded[short] = module
    return loaded


def support():
    """The support package, each module by its short name."""
    return types.SimpleNamespace(**package("support"))


def load_with(name, path, globals_):
    """A module given `globals_` once its code has run, as the kernel's loader does."""
    module = load(name, path)
    for key, value in globals_.items():
        setattr(module, key, value)
    return module


def checkpoint():
    """The checkpoint package, each module by its short name, with flowrepl's cloudpickle."""
    cloudpickle = load("_flowrepl_cloudpickle", WORKER / "vendor" / "cloudpickle" / "cloudpickle.py")
    sys.modules.pop("_flowrepl_cloudpickle", None)
    loaded = package("checkpoint")
    loaded["picklable"].cloudpickle = cloudpickle
    return types.SimpleNamespace(**loaded)
