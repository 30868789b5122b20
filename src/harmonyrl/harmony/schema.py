"""JSON schema → the TypeScript-like tool declarations that harmony puts in the developer message.

A faithful port of openai-harmony's ``json_schema_to_typescript`` / ``template_tools_section`` (including its
quirks, e.g. a nested object's description is printed twice and enum string defaults are unquoted), because
GPT-OSS checkpoints were trained on exactly this text and tests/harmony compare it byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from harmonyrl.types import ToolSpec

Schema = Mapping[str, object]


def _is_enum(schema: Schema) -> bool:
    values = schema.get("enum")
    return isinstance(values, list) and len(values) > 0


def _default_text(schema: Schema, quote_strings: bool = True) -> str:
    """Render ``default`` like serde_json's Display: strings quoted unless the schema is an enum."""
    default = schema["default"]
    if isinstance(default, str):
        return f'"{default}"' if quote_strings and not _is_enum(schema) else default
    return json.dumps(default, separators=(",", ":"), ensure_ascii=False)


def _with_null(variant: object, type_str: str) -> str:
    nullable = isinstance(variant, Mapping) and variant.get("nullable") is True
    return f"{type_str} | null" if nullable and "null" not in type_str else type_str


def _one_of_top(variants: list[object], indent: str) -> str:
    out = ""
    for variant in variants:
        out += f"\n{indent} | "
        schema = variant if isinstance(variant, Mapping) else {}
        out += _with_null(variant, to_typescript(schema, indent + "   "))
        comments = []
        if isinstance(schema.get("description"), str):
            comments.append(str(schema["description"]))
        if "default" in schema:
            comments.append(f"default: {_default_text(schema)}")
        if comments:
            out += " // " + " ".join(comments)
    return out


def _one_of_property(key: str, val: Schema, variants: list[object], required: bool, indent: str) -> str:
    prop_desc = val.get("description") if isinstance(val.get("description"), str) else None
    first = variants[0] if variants and isinstance(variants[0], Mapping) else {}
    skip = prop_desc is not None and first.get("description") == prop_desc
    out, desc_above = "", False
    if prop_desc is not None and not skip:
        out += f"{indent}// {prop_desc}\n"
        desc_above = True
    if "default" in val:
        out += f"{indent}// default: {_default_text(val)}\n"
    out += f"{indent}{key}{'' if required else '?'}:\n"
    for i, variant in enumerate(variants):
        schema = variant if isinstance(variant, Mapping) else {}
        out += f"{indent} | " + _with_null(variant, to_typescript(schema, indent + "   "))
        comments = []
        desc = schema.get("description")
        if not (i == 0 and desc_above) and isinstance(desc, str) and desc != prop_desc:
            comments.append(desc)
        if "default" in schema:
            comments.append(f"default: {_default_text(schema)}")
        if comments:
            out += " // " + " ".join(comments)
        out += "\n"
    return out + f"{indent},\n"


def _property(key: str, val: Schema, required: bool, indent: str) -> str:
    out = ""
    if isinstance(val.get("title"), str):
        out += f"{indent}// {val['title']}\n{indent}//\n"
    one_of = val.get("oneOf")
    if one_of is None and isinstance(val.get("description"), str):
        out += f"{indent}// {val['description']}\n"
    examples = val.get("examples")
    if isinstance(examples, list) and examples:
        out += f"{indent}// Examples:\n"
        out += "".join(f'{indent}// - "{ex}"\n' for ex in examples if isinstance(ex, str))
    if isinstance(one_of, list):
        return out + _one_of_property(key, val, one_of, required, indent)
    out += f"{indent}{key}{'' if required else '?'}: "
    out += _with_null(val, to_typescript(val, indent + "    ")) + ","
    if "default" in val:
        out += f" // default: {_default_text(val)}"
    return out + "\n"


def _object(schema: Schema, indent: str) -> str:
    out = f"{indent}// {schema['description']}\n" if isinstance(schema.get("description"), str) else ""
    out += "{\n"
    props = schema.get("properties")
    req = schema.get("required")
    required = {r for r in req if isinstance(r, str)} if isinstance(req, list) else set()
    if isinstance(props, Mapping):
        for key, val in props.items():
            out += _property(str(key), val if isinstance(val, Mapping) else {}, key in required, indent)
    return out + f"{indent}}}"


def to_typescript(schema: Schema, indent: str = "") -> str:
    """Type expression for ``schema`` (``indent`` prefixes nested lines, as in openai-harmony)."""
    one_of = schema.get("oneOf")
    if isinstance(one_of, list):
        return _one_of_top(one_of, indent)
    ty = schema.get("type")
    if isinstance(ty, list):
        names = ["number" if t == "integer" else t for t in ty if isinstance(t, str)]
        if names:
            return " | ".join(names)
    if ty == "object":
        return _object(schema, indent)
    if ty == "string":
        enum = schema.get("enum")
        values = [f'"{v}"' for v in enum if isinstance(v, str)] if isinstance(enum, list) else []
        return " | ".join(values) if values else "string"
    if ty in ("number", "integer"):
        return "number"
    if ty == "boolean":
        return "boolean"
    if ty == "array":
        items = schema.get("items")
        return f"{to_typescript(items, indent)}[]" if isinstance(items, Mapping) else "Array<any>"
    return "any"


def _rust_lines(text: str) -> list[str]:
    """``str::lines`` semantics (split on ``\n`` only, drop one trailing empty line, strip ``\r``)."""
    if not text:
        return []
    parts = text.split("\n")
    if text.endswith("\n"):
        parts.pop()
    return [p.removesuffix("\r") for p in parts]


def tools_section(tools: Sequence[ToolSpec], namespace: str = "functions") -> str:
    """The ``# Tools`` section declaring ``tools`` in one namespace (openai-harmony's template)."""
    lines = [f"## {namespace}\n", f"namespace {namespace} {{\n"]
    for tool in tools:
        lines.extend(f"// {line}" for line in _rust_lines(tool.description))
        if tool.parameters:
            lines.append(f"type {tool.name} = (_: {to_typescript(tool.parameters)}) => any;\n")
        else:
            lines.append(f"type {tool.name} = () => any;\n")
    lines.append(f"}} // namespace {namespace}")
    return "# Tools\n\n" + "\n".join(lines)
