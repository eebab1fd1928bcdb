"""Validates custom resources against a CRD's openAPIV3Schema the way the API server's strict
field validation would: unknown fields are errors (additionalProperties: false on every object
that does not preserve unknown fields), `nullable` allows null.

usage: validate_cr.py CRD.yaml CR.yaml...   exit 0 when every CR is valid; prints each error.
Documents of other kinds in the files are skipped."""
import sys

import jsonschema
import yaml


def strict(schema):
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) if k != "default" else v for k, v in schema.items()}
    for key in ("properties",):
        if key in out:
            out[key] = {name: strict(s) for name, s in schema[key].items()}
    if "items" in out:
        out["items"] = strict(schema["items"])
    if "additionalProperties" in schema and isinstance(schema["additionalProperties"], dict):
        out["additionalProperties"] = strict(schema["additionalProperties"])
    for key in ("anyOf", "oneOf", "allOf"):
        if key in out:
            out[key] = [strict(s) for s in schema[key]]
    if (out.get("type") == "object" and "properties" in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in out):
        out["additionalProperties"] = False
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


def main():
    crd = yaml.safe_load(open(sys.argv[1]))
    schema = strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    # metadata is the API server's; only its shape matters here.
    schema.setdefault("properties", {})["metadata"] = {"type": "object"}
    schema["properties"]["apiVersion"] = {"const": crd["spec"]["group"] + "/" + crd["spec"]["versions"][0]["name"]}
    schema["properties"]["kind"] = {"const": crd["spec"]["names"]["kind"]}
    failed = False
    for path in sys.argv[2:]:
        for doc in yaml.safe_load_all(open(path)):
            # Other documents of the file (a Namespace, a Secret) are the API server's to check.
            if doc is None or doc.get("kind") != crd["spec"]["names"]["kind"]:
                continue
            errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
            for e in errors:
                failed = True
                print("%s: %s: %s" % (path, "/".join(str(p) for p in e.path) or "(root)", e.message))
    if not failed:
        print("VALID")
    sys.exit(1 if failed else 0)


main()
