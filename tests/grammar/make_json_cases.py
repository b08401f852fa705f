#!/usr/bin/env python3
"""Writes tests/data/grammar/json_schema_cases.json: JSON schemas with texts the grammar must
accept or reject, each checked here with the `jsonschema` package (with its format checker):
every text to accept must be valid JSON under the schema, so the C++ test's expectations are
the validator's, not ours. Texts to reject are either invalid or valid but outside the
grammar's policy (whitespace, property order, no unlisted properties: docs/structured-output.md);
the file records which.

With --check-walks FILE (JSON lines {"case": name, "text": ...}, as test_grammar writes when
FLEXH2O_GRAMMAR_WALKS names a file), validates generated texts instead and prints the count.

Usage: python tests/grammar/make_json_cases.py   (venv with jsonschema, rfc3339-validator, rfc3987)
"""
import argparse
import json
import pathlib
import sys

import jsonschema

OUT = pathlib.Path(__file__).resolve().parents[1] / "data" / "grammar" / "json_schema_cases.json"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "email": {"type": "string", "format": "email"},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}

CASES = [
    ("integer_bounds", {"type": "integer", "minimum": -12, "maximum": 305},
     ["-12", "-1", "0", "7", "99", "305", "300"],
     ["-13", "306", "1000", "01", "-0", "1.0", "", "+5"]),
    ("integer_exclusive", {"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 100.5},
     ["10", "100", "55"], ["9", "101", "-3"]),
    ("integer_open_low", {"type": "integer", "minimum": 17},
     ["17", "18", "99", "100", "123456789012345678901"], ["16", "0", "-17"]),
    ("integer_open_high", {"type": "integer", "maximum": -3},
     ["-3", "-4", "-1000"], ["-2", "0", "3"]),
    ("number_bounds", {"type": "number", "minimum": 0, "maximum": 1},
     ["0", "1", "0.5", "0.999", "0.0"], ["1.5", "-0.1", "2", "1e0", "1.0"]),
    ("number_negative", {"type": "number", "minimum": -2.5, "maximum": -1},
     ["-2", "-1", "-1.75"], ["-3", "0", "-0.5", "-2.6", "-2.25"]),
    ("number_exclusive", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 2},
     ["0.5", "1", "1.999", "0.01", "0.10"], ["0", "0.0", "0.00", "2", "2.0", "-0.5"]),
    ("number_exclusive_negative", {"type": "number", "exclusiveMinimum": -1, "maximum": 0},
     ["-0.5", "0", "-0.001"], ["-1", "-1.0", "-1.5", "0.5", "-0"]),
    ("number_positive_open", {"type": "number", "exclusiveMinimum": 0},
     ["0.25", "3", "1000000.5"], ["0", "-1", "0.000"]),
    ("number_any", {"type": "number"},
     ["0", "-1.5", "3e10", "2.5E-3", "-0.0", "1e99"], ["01", ".5", "1.", "1e", "+1", "NaN", "1e100"]),
    ("string_lengths", {"type": "string", "minLength": 2, "maxLength": 3},
     ['"ab"', '"abc"', '"\u00e9\u00e9"', '"a\\n"', '"\\u0041b"'], ['"a"', '"abcd"', '"\\ud83d\\ude00"', '"a']),
    ("string_escapes", {"type": "string"},
     ['""', '"a\\"b"', '"\\\\"', '"\\/\\b\\f\\n\\r\\t"', '"\u20ac\U0001F600"'],
     ['"a\nb"', '"\\x41"', '"\\u12"', '"abc', "'a'"]),
    ("string_pattern", {"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"},
     ['"AB-123"', '"ZZ-000"'], ['"AB-12"', '"ab-123"', '"AB-1234"']),
    ("string_pattern_search", {"type": "string", "pattern": "\\d{2}"},
     ['"12"', '"ab12cd"', '"x99"'], ['"1a2"', '""']),
    ("format_date", {"type": "string", "format": "date"},
     ['"2024-02-29"', '"1999-12-31"', '"0001-01-01"'], ['"2023-02-29"', '"2024-13-01"', '"2024-04-31"', '"24-01-01"']),
    ("format_date_time", {"type": "string", "format": "date-time"},
     ['"2024-05-06T07:08:09Z"', '"2024-05-06T23:59:59.123+05:30"'], ['"2024-05-06 07:08:09Z"', '"2024-05-06T24:00:00Z"']),
    ("format_time", {"type": "string", "format": "time"},
     ['"07:08:09Z"', '"23:59:59-08:00"'], ['"7:08:09Z"', '"07:08:09"']),
    ("format_email", {"type": "string", "format": "email"},
     ['"a.b@example.com"', '"x+y@mail.co.uk"'], ['"ab.com"', '"a@b"']),
    ("format_uuid", {"type": "string", "format": "uuid"},
     ['"123e4567-e89b-12d3-a456-426614174000"'], ['"123e4567e89b12d3a456426614174000"', '"123e4567-e89b-12d3-a456-42661417400"']),
    ("format_uri", {"type": "string", "format": "uri"},
     ['"https://example.com/a/b?q=1#top"', '"http://x.org:8080"'], ['"example.com"', '"http://"']),
    ("enum_const", {"enum": ["red", 3, None, {"a": [1]}]},
     ['"red"', "3", "null", '{"a":[1]}'], ['"blue"', "4", '{"a": [1]}']),
    ("const", {"const": "fixed"}, ['"fixed"'], ['"other"']),
    ("type_list_nullable", {"type": ["string", "null"], "maxLength": 2},
     ['"ab"', "null"], ['"abc"', "1"]),
    ("nullable_openapi", {"type": "integer", "nullable": True}, ["5", "null"], ['"5"']),
    ("boolean", {"type": "boolean"}, ["true", "false"], ["True", "1"]),
    ("object_person", PERSON,
     ['{"name":"Al","age":30}', '{"name":"Al","age":30,"email":"a@b.co"}',
      '{\n  "name": "Al",\n  "age": 30\n}', '{ "name":"x","age":0 }'],
     ['{"age":30,"name":"Al"}', '{"name":"Al"}', '{"name":"","age":3}', '{"name":"Al","age":30,"x":1}',
      '{"name" :"Al","age":30}', '{"name":"Al","age":131}']),
    ("object_optional_order", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}},
     ["{}", '{"a":1}', '{"b":2}', '{"a":1,"c":3}', '{"a":1,"b":2,"c":3}'],
     ['{"b":2,"a":1}', '{,"a":1}', '{"a":1,}', '{"d":4}']),
    ("object_additional_schema", {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
                                  "additionalProperties": {"type": "string"}},
     ['{"id":1}', '{"id":1,"x":"y"}', '{"id":1,"i":"a","idx":"b"}'],
     ['{"id":1,"x":2}', '{"id":1,"id":"z"}', '{"x":"y","id":1}']),
    ("object_any", {"type": "object"},
     ["{}", '{"a":1,"b":[true,{"c":null}]}', '{"k":"\\u00e9"}'], ["[]", '{"a"}', '{"a":1,}']),
    ("array_items", {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
     ["[1]", "[1,2,3]", "[ 1, 2 ]"], ["[]", "[1,2,3,4]", '["a"]', "[1,]"]),
    ("array_prefix", {"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": False},
     ["[]", '["a"]', '["a",true]'], ['["a",true,1]', "[true]"]),
    ("array_prefix_min", {"type": "array", "prefixItems": [{"const": 1}], "items": {"type": "null"}, "minItems": 2},
     ["[1,null]", "[1,null,null]"], ["[1]", "[null,null]"]),
    ("any_of", {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "string"}}]},
     ["5", '["a","b"]', "[]"], ['"a"', "[1]"]),
    ("one_of_objects", {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind", "x"]},
        {"type": "object", "properties": {"kind": {"const": "b"}, "y": {"type": "string"}}, "required": ["kind", "y"]}]},
     ['{"kind":"a","x":1}', '{"kind":"b","y":"s"}'], ['{"kind":"a","y":"s"}', '{"kind":"c","x":1}']),
    ("all_of", {"allOf": [
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
        {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
     ['{"a":1,"b":"x"}'], ['{"a":1}', '{"b":"x","a":1}']),
    ("ref_defs", {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                                      "required": ["x", "y"], "additionalProperties": False}},
                  "type": "array", "items": {"$ref": "#/$defs/point"}},
     ['[{"x":1,"y":2.5}]', "[]"], ['[{"x":1}]', '[{"y":1,"x":2}]']),
    ("ref_recursive", {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                           "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                                          "required": ["v"]}},
                       "$ref": "#/$defs/node"},
     ['{"v":1}', '{"v":1,"kids":[{"v":2,"kids":[]},{"v":3}]}'], ['{"kids":[]}', '{"v":1,"kids":[{}]}']),
    ("ref_definitions_draft7", {"$schema": "http://json-schema.org/draft-07/schema#",
                                "definitions": {"s": {"type": "string", "maxLength": 1}},
                                "type": "object", "properties": {"t": {"$ref": "#/definitions/s"}}, "required": ["t"]},
     ['{"t":"a"}'], ['{"t":"ab"}']),
    ("annotations_ignored", {"title": "T", "description": "d", "examples": [1], "default": 2, "$comment": "c",
                             "type": "integer", "maximum": 2},
     ["2", "-5"], ["3"]),
    ("empty_schema_any", {}, ["1", '"s"', '{"a":[1,{"b":null}]}', "[]", "true"], ["", "{", "tru"]),
    ("required_unlisted", {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]},
     ['{"b":null}', '{"a":1,"b":[2]}', '{"b":{"c":"d"}}'], ['{"a":1}', '{}', '{"b":1,"a":1}', '{"a":1,"b":1,"c":2}']),
    ("required_unlisted_typed", {"type": "object", "required": ["top"], "additionalProperties": {"type": "string"}},
     ['{"top":"x"}', '{"top":"x","a":"b"}'], ['{}', '{"top":1}', '{"a":"b"}', '{"a":"b","top":"x"}']),
    ("pattern_properties_only", {"type": "object", "patternProperties": {"^x[0-9]+$": {"type": "integer"}}},
     ['{}', '{"x1":2}', '{"x1":2,"x22":-3}'], ['{"y":1}', '{"x1":"a"}', '{"x":1}', '{"\\u00781":2}']),
    ("pattern_properties_listed_match", {"type": "object", "properties": {"x1": {"type": "integer", "minimum": 0},
                                                                          "name": {"type": "string"}},
                                         "patternProperties": {"^x": {"maximum": 5}}},
     ['{"x1":3,"name":"a"}', '{"name":"b"}'], ['{"x1":6}', '{"x2":1}', '{"name":"a","x2":1}']),
    ("pattern_properties_closed", {"type": "object", "properties": {"a": {"type": "boolean"}},
                                   "patternProperties": {"^[0-9]+$": {"type": "string"}},
                                   "additionalProperties": False, "required": ["7"]},
     ['{"a":true,"7":"s"}', '{"7":"s"}'], ['{"7":1}', '{"a":true}', '{"b":"s","7":"s"}', '{"7":"s","12":"t"}']),
    ("min_properties", {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "minProperties": 1},
     ['{"a":1}', '{"b":true}', '{"a":1,"b":false}'], ['{}']),
    ("min_properties_extras", {"type": "object", "properties": {"a": {"type": "integer"}},
                               "additionalProperties": {"type": "string"}, "minProperties": 3},
     ['{"a":1,"x":"1","y":"2"}', '{"x":"1","y":"2","z":"3"}', '{"a":1,"x":"1","y":"2","z":"3"}'],
     ['{"a":1,"x":"1"}', '{}', '{"x":"1"}']),
    ("false_property", {"type": "object", "properties": {"a": {"type": "integer"}, "b": False}},
     ['{"a":1}', '{}'], ['{"b":1}', '{"a":1,"b":1}']),
    ("additional_items_ignored", {"type": "array", "items": {"type": "integer"}, "additionalItems": False},
     ['[1,2]', '[]'], ['["a"]']),
    ("format_ipv4", {"type": "string", "format": "ipv4"},
     ['"192.168.0.1"', '"0.0.0.0"', '"255.255.255.255"'], ['"256.1.1.1"', '"01.1.1.1"', '"1.1.1"', '"1.2.3.4 "']),
    ("unicode_property", {"type": "object", "properties": {"caf\u00e9": {"type": "boolean"}}, "required": ["caf\u00e9"]},
     ['{"caf\u00e9":true}'], ['{"cafe":true}']),
]

# Schemas the compiler must refuse, with the words its error must contain.
ERRORS = [
    ("not", {"not": {"type": "string"}}, "keyword 'not' is not supported"),
    ("pattern_properties_two", {"type": "object", "patternProperties": {"^a": {}, "^b": {}}},
     "'patternProperties' with more than one pattern is not supported"),
    ("min_properties_unreachable", {"type": "object", "properties": {"a": {}}, "minProperties": 2},
     "'minProperties' is more than the properties the object may have"),
    ("required_false_property", {"type": "object", "properties": {"a": False}, "required": ["a"]},
     "required property with the schema 'false'"),
    ("unique_items", {"type": "array", "uniqueItems": True}, "keyword 'uniqueItems' is not supported"),
    ("multiple_of", {"type": "integer", "multipleOf": 3}, "keyword 'multipleOf' is not supported"),
    ("if_then", {"if": {"type": "string"}, "then": {"minLength": 1}}, "keyword 'if' is not supported"),
    ("unknown_format", {"type": "string", "format": "ipv6"}, "format 'ipv6' is not supported"),
    ("remote_ref", {"$ref": "https://example.com/s.json"}, "is not a local reference"),
    ("missing_ref", {"$ref": "#/$defs/nope"}, "points nowhere"),
    ("false_schema", False, "matches nothing"),
    ("required_unlisted_closed", {"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": False},
     "required property \"b\" is not in 'properties' and 'additionalProperties' is false"),
    ("empty_int_range", {"type": "integer", "minimum": 5, "maximum": 4}, "no integer satisfies"),
    ("left_recursive_ref", {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"}, "left-recursive"),
    ("never_completes", {"$defs": {"a": {"type": "object", "properties": {"n": {"$ref": "#/$defs/a"}}, "required": ["n"]}},
                         "$ref": "#/$defs/a"}, "can never complete"),
    ("unknown_type", {"type": "decimal"}, "unknown type 'decimal'"),
    ("lookahead_pattern", {"type": "string", "pattern": "(?=a)"}, "lookaround"),
]


def openapi_nullable(schema):
    """OpenAPI 3.0's "nullable": true (which the grammar honors) as JSON Schema: null added to type."""
    if isinstance(schema, dict):
        schema = {k: openapi_nullable(v) for k, v in schema.items()}
        if schema.pop("nullable", False) is True and "type" in schema:
            types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
            schema["type"] = types + ["null"]
    elif isinstance(schema, list):
        schema = [openapi_nullable(v) for v in schema]
    return schema


def validator(schema):
    schema = openapi_nullable(schema)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def is_valid(schema, text):
    try:
        instance = json.loads(text)
    except ValueError:
        return False
    return validator(schema).is_valid(instance)


def write_cases():
    out = {"cases": [], "errors": []}
    for name, schema, accept, reject in CASES:
        texts = []
        for text in accept:
            if not is_valid(schema, text):
                sys.exit(f"{name}: {text!r} is to be accepted but jsonschema finds it invalid")
            texts.append({"text": text, "accept": True, "valid": True})
        for text in reject:
            texts.append({"text": text, "accept": False, "valid": is_valid(schema, text)})
        out["cases"].append({"name": name, "schema": schema, "texts": texts})
    for name, schema, message in ERRORS:
        out["errors"].append({"name": name, "schema": schema, "message": message})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {OUT}: {len(out['cases'])} schemas, {sum(len(c['texts']) for c in out['cases'])} texts, "
          f"{len(out['errors'])} errors")


def check_walks(path):
    schemas = {name: schema for name, schema, _, _ in CASES}
    total = bad = 0
    for line in pathlib.Path(path).read_text().splitlines():
        walk = json.loads(line)
        total += 1
        if not is_valid(schemas[walk["case"]], walk["text"]):
            bad += 1
            print(f"INVALID {walk['case']}: {walk['text']!r}")
    print(f"{total} generated texts, {total - bad} valid under jsonschema, {bad} invalid")
    return 1 if bad else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check-walks", metavar="FILE")
    args = parser.parse_args()
    sys.exit(check_walks(args.check_walks) if args.check_walks else write_cases())
