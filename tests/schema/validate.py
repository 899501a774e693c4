"""Validates task logs against docs/schema/v1 (the `jsonschema` package, draft 2020-12).

Strict: on top of the published schemas (which allow fields added later within a version),
a record may carry no field its schema does not describe, so a field the kernel writes
without documenting it fails the tests.

Usage: validate.py FILE...      validates the files, exit 1 on the first bad record
       validate.py --serve      reads one path per line on stdin, answers one line each:
                                `ok N` (records checked) or `error PATH:LINE: message`
Lines that are not JSON objects with a `type` are left to the tolerant reader (tests write
such lines on purpose); every record must validate.
"""
import json
import pathlib
import sys

import jsonschema
from referencing import Registry, Resource

SCHEMA_DIR = pathlib.Path(__file__).resolve().parents[2] / "docs" / "schema" / "v1"
TYPES = ("execution", "event", "context", "session", "file", "install", "egress")


def load():
    resources = []
    for f in sorted(SCHEMA_DIR.glob("*.schema.json")):
        doc = json.loads(f.read_text())
        jsonschema.Draft202012Validator.check_schema(doc)
        resources.append((doc["$id"], Resource.from_contents(doc)))
    registry = Registry().with_resources(resources)
    base = "https://flowrepl.invalid/schema/v1/"
    published = jsonschema.Draft202012Validator({"$ref": base + "record.schema.json"}, registry=registry)
    strict = {
        t: jsonschema.Draft202012Validator(
            {"$ref": base + f"{t}.schema.json", "unevaluatedProperties": False},
            registry=registry,
            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
        )
        for t in TYPES
    }
    return published, strict


PUBLISHED, STRICT = load()


def check(path):
    """Number of records checked, or raises ValueError naming the line."""
    n = 0
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if not isinstance(rec, dict) or "type" not in rec:
                continue
            for v in (PUBLISHED, STRICT.get(rec["type"])):
                if v is None:
                    raise ValueError(f"{path}:{i}: unknown record type {rec['type']!r}")
                err = jsonschema.exceptions.best_match(v.iter_errors(rec))
                if err is not None:
                    where = "/".join(str(p) for p in err.absolute_path)
                    raise ValueError(f"{path}:{i}: {rec['type']} record, at {where or 'top'}: {err.message}")
            n += 1
    return n


def main():
    if sys.argv[1:] == ["--serve"]:
        for line in sys.stdin:
            path = line.rstrip("\n")
            try:
                print(f"ok {check(path)}", flush=True)
            except (ValueError, OSError) as e:
                print(f"error {e}".replace("\n", " "), flush=True)
        return
    total = 0
    for p in sys.argv[1:]:
        try:
            total += check(p)
        except ValueError as e:
            print(e, file=sys.stderr)
            sys.exit(1)
    print(f"{total} records valid")


if __name__ == "__main__":
    main()
