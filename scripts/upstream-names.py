#!/usr/bin/env python3
"""Lists the names a launch export may use, read statically from a pinned upstream checkout (no
torch needed), for the tests that check `tedsim --emit` against them:

  scripts/upstream-names.py megatron-lm CHECKOUT        > tests/data/megatron-lm-flags.txt
  scripts/upstream-names.py megatron-deepspeed CHECKOUT > tests/data/megatron-deepspeed-flags.txt
  scripts/upstream-names.py deepspeed CHECKOUT          > tests/data/deepspeed-config-keys.txt

The commit is the checkout's HEAD (or UPSTREAM_COMMIT where the files were copied out of one).

megatron-lm:
The parser (megatron/training/arguments.py) adds flags two ways: literal add_argument('--x')
calls, and ArgumentGroupFactory(ConfigClass, exclude=[...]) groups, which turn every dataclass
field of the class (and its bases) into --field-name, or --no-field-name / --disable-field-name
for a bool whose default is True (megatron/training/argument_utils.py). Both are followed here.
"""
import ast
import os
import pathlib
import re
import subprocess
import sys

kind, root = sys.argv[1], pathlib.Path(sys.argv[2])
commit = os.environ.get("UPSTREAM_COMMIT") or subprocess.run(
    ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def literal_flags(path):
    return set(re.findall(r"""['"](--[a-z0-9][a-z0-9_-]*)['"]""", path.read_text()))


if kind == "megatron-deepspeed":
    # megatron/arguments.py: literal add_argument calls only.
    print(f"# Flags of Megatron-DeepSpeed's argument parser (megatron/arguments.py) at commit {commit}")
    print("# made by scripts/upstream-names.py megatron-deepspeed")
    for f in sorted(literal_flags(root / "megatron/arguments.py")):
        print(f)
    sys.exit(0)

if kind == "deepspeed":
    # Top-level ds_config keys (deepspeed/runtime/constants.py) and, as section.key, the fields of
    # the zero_optimization, bf16 and fp16 sections (pydantic models).
    keys = set(re.findall(r'^[A-Z0-9_]+ = "([a-z0-9_]+)"', (root / "deepspeed/runtime/constants.py").read_text(), re.M))
    for section, path, cls in [("zero_optimization", "deepspeed/runtime/zero/config.py", "DeepSpeedZeroConfig"),
                               ("bf16", "deepspeed/runtime/precision_config.py", "DeepSpeedBF16Config"),
                               ("fp16", "deepspeed/runtime/precision_config.py", "DeepSpeedFP16Config")]:
        keys.add(section)
        tree = ast.parse((root / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                        keys.add(section + "." + stmt.target.id)
    # The flags deepspeed.add_config_arguments adds to a training script's parser.
    keys |= literal_flags(root / "deepspeed/__init__.py")
    print(f"# ds_config keys of DeepSpeed at commit {commit} (deepspeed/runtime/constants.py; the zero_optimization,")
    print("# bf16 and fp16 fields of zero/config.py and precision_config.py; the --flags of deepspeed/__init__.py),")
    print("# made by scripts/upstream-names.py deepspeed")
    for k in sorted(keys):
        print(k)
    sys.exit(0)

assert kind == "megatron-lm", "first argument: megatron-lm, megatron-deepspeed or deepspeed"
args_py = root / "megatron/training/arguments.py"
source = args_py.read_text()
flags = set(re.findall(r"""['"](--[a-z0-9][a-z0-9-]*)['"]""", source))

classes = {}
for path in (root / "megatron").rglob("*.py"):
    try:
        tree = ast.parse(path.read_text())
    except (SyntaxError, UnicodeDecodeError):
        continue
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            classes.setdefault(node.name, node)


def fields(name, seen=()):
    node = classes.get(name)
    if node is None or name in seen:
        return []
    out = []
    for base in node.bases:
        if isinstance(base, ast.Name):
            out += fields(base.id, seen + (name,))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            default = stmt.value
            names = None
            # field(default=..., metadata={"argparse_meta": {"arg_names": [...]}}): the names given win.
            if isinstance(default, ast.Call) and getattr(default.func, "id", None) == "field":
                kws = {kw.arg: kw.value for kw in default.keywords}
                default = kws.get("default")
                meta = kws.get("metadata")
                if isinstance(meta, ast.Dict):
                    for k, v in zip(meta.keys, meta.values):
                        if isinstance(k, ast.Constant) and k.value == "argparse_meta" and isinstance(v, ast.Dict):
                            for k2, v2 in zip(v.keys, v.values):
                                if isinstance(k2, ast.Constant) and k2.value == "arg_names" and isinstance(v2, (ast.List, ast.Tuple)):
                                    names = [e.value for e in v2.elts if isinstance(e, ast.Constant)]
            default_true = isinstance(default, ast.Constant) and default.value is True
            is_bool = isinstance(stmt.annotation, ast.Name) and stmt.annotation.id == "bool"
            out.append((stmt.target.id, is_bool and default_true, names))
    return out


tree = ast.parse(source)
for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ArgumentGroupFactory" and node.args:
        cls = node.args[0].id if isinstance(node.args[0], ast.Name) else None
        exclude = set()
        for kw in node.keywords:
            if kw.arg == "exclude" and isinstance(kw.value, (ast.List, ast.Tuple)):
                exclude = {e.value for e in kw.value.elts if isinstance(e, ast.Constant)}
            elif kw.arg == "exclude" and isinstance(kw.value, ast.Name):
                # exclude=some_list defined above: find its literal
                for n in ast.walk(tree):
                    if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == kw.value.id for t in n.targets):
                        if isinstance(n.value, (ast.List, ast.Tuple)):
                            exclude |= {e.value for e in n.value.elts if isinstance(e, ast.Constant)}
        for name, store_false, names in fields(cls):
            if name.startswith("_") or name in exclude:
                continue
            dashed = name.replace("_", "-")
            if names:
                flags.update(names)
            elif store_false:
                flags.update({"--no-" + dashed, "--disable-" + dashed})
            else:
                flags.add("--" + dashed)

print(f"# Flags of Megatron-LM's training argument parser at commit {commit or 'unknown'}")
print("# (megatron/training/arguments.py and the dataclass groups it builds), made by scripts/upstream-names.py megatron-lm")
for f in sorted(flags):
    print(f)
