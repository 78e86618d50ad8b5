"""What Bazel and TensorFlow's API tests would reject before compiling anything.

* BUILD edits (BUILD files parsed with Python's ``ast``: Starlark BUILD files are Python syntax):
  every source the patch adds is in ``srcs`` of a compiling rule of its package, every header
  (``.h``, ``.inc``) it adds is in a rule or filegroup there; every label the patch adds names a
  target or an exported file that exists, visible from the package that names it; ``@repo//``
  labels name a header folder the wheel ships.
* API golden files (``tensorflow/tools/api/golden/v{1,2}/tensorflow.config.experimental.pbtxt``)
  list exactly the functions ``config.py`` exports under ``config.experimental``, with the
  argument names of their definitions; the v1 ``GPUOptions`` golden lists the LMS fields of the
  patched ``config.proto`` with their numbers.
* Every ``pywrap_tfe.NAME`` that ``context.py``/``config.py`` use is a name ``tfe_wrapper.cc``
  defines on the ``_pywrap_tfe`` module.

Each function returns a list of problems, ``(tree path, message)``; empty means consistent.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

Problem = tuple[str, str]
COMPILING_RULES_EXCLUDED = {"filegroup", "exports_files", "package_group", "package", "load"}


# ---------------------------------------------------------------------------------------------
# BUILD files
class BuildFile:
    """The calls of one BUILD file: rules by name, exports_files, package default_visibility."""

    def __init__(self, path: Path):
        self.path = path
        self.module = ast.parse(path.read_text(), str(path))
        self.names: dict[str, ast.AST] = {}
        self.rules: dict[str, tuple[str, dict[str, ast.AST]]] = {}
        self.exported: dict[str, ast.AST | None] = {}
        self.default_visibility: ast.AST | None = None
        for node in self.module.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.names[node.targets[0].id] = node.value
            if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
                continue
            call = node.value
            fn = call.func.id if isinstance(call.func, ast.Name) else ast.unparse(call.func)
            kw = {k.arg: k.value for k in call.keywords if k.arg}
            if fn == "package":
                self.default_visibility = kw.get("default_visibility")
            elif fn == "exports_files":
                srcs = kw.get("srcs", call.args[0] if call.args else None)
                for f in self.strings(srcs):
                    self.exported[f] = kw.get("visibility")
            elif isinstance(kw.get("name"), ast.Constant):
                self.rules[kw["name"].value] = (fn, kw)

    def strings(self, node: ast.AST | None) -> list[str]:
        """The string values an attribute can take in an OSS build (both branches of select)."""
        if node is None:
            return []
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, (ast.List, ast.Tuple)):
            return [s for e in node.elts for s in self.strings(e)]
        if isinstance(node, ast.BinOp):
            return self.strings(node.left) + self.strings(node.right)
        if isinstance(node, ast.Name):
            return self.strings(self.names.get(node.id))
        if isinstance(node, ast.Dict):
            return [s for v in node.values for s in self.strings(v)]
        if isinstance(node, ast.Call):
            fn = node.func.id if isinstance(node.func, ast.Name) else ""
            if fn in ("if_oss", "set_external_visibility"):   # OSS: the first branch, or public
                return self.strings(node.args[0]) if fn == "if_oss" else ["//visibility:public"]
            if fn == "if_google":                              # OSS: the second branch
                return self.strings(node.args[1]) if len(node.args) > 1 else []
            if fn == "glob":
                return []
            return [s for a in node.args for s in self.strings(a)] + \
                   [s for k in node.keywords for s in self.strings(k.value)]
        return []


class Tree:
    def __init__(self, root: Path):
        self.root = root
        self._cache: dict[str, BuildFile | None] = {}

    def build(self, pkg: str) -> BuildFile | None:
        if pkg not in self._cache:
            p = self.root / pkg / "BUILD"
            self._cache[pkg] = BuildFile(p) if p.is_file() else None
        return self._cache[pkg]

    def package_group_allows(self, label: str, pkg: str, seen: set | None = None) -> bool:
        gpkg, name = split_label(label, "")
        bf = self.build(gpkg)
        if bf is None or name not in bf.rules or bf.rules[name][0] != "package_group":
            return False
        seen = seen or set()
        if label in seen:
            return False
        seen.add(label)
        kw = bf.rules[name][1]
        for pat in bf.strings(kw.get("packages")):
            if pat in ("//...", "public") or pat == f"//{pkg}" or (
                    pat.endswith("/...") and (pkg + "/").startswith(pat[2:-3].rstrip("/") + "/")):
                return True
        return any(self.package_group_allows(inc, pkg, seen) for inc in bf.strings(kw.get("includes")))

    def visible(self, vis: list[str], pkg: str) -> bool:
        for v in vis:
            if v == "//visibility:public":
                return True
            vpkg, vname = split_label(v, "")
            if vname == "__pkg__" and vpkg == pkg:
                return True
            if vname == "__subpackages__" and (pkg + "/").startswith(vpkg + "/"):
                return True
            if vname not in ("__pkg__", "__subpackages__") and self.package_group_allows(v, pkg):
                return True
        return False


def split_label(label: str, here: str) -> tuple[str, str]:
    if label.startswith(":"):
        return here, label[1:]
    body = label[2:] if label.startswith("//") else label
    if ":" in body:
        pkg, name = body.split(":", 1)
    else:
        pkg, name = body, body.rsplit("/", 1)[-1]
    return pkg, name


def check_label(tree: Tree, label: str, here: str, wheel_include: Path) -> str | None:
    """None when ``label`` (written in package ``here``) exists and ``here`` may use it."""
    if label.startswith("@"):
        repo, _, rest = label[1:].partition("//")
        folder = rest.split(":")[0]
        if repo == "com_google_absl":
            header = wheel_include / folder / (rest.split(":")[-1] + ".h")
            return None if header.exists() else f"{label}: no {header.name} in the wheel's {folder}/"
        return None if (wheel_include / "external" / repo).exists() else f"{label}: no external/{repo} in the wheel"
    pkg, name = split_label(label, here)
    bf = tree.build(pkg)
    if bf is None:
        return f"{label}: no package //{pkg} (no {pkg}/BUILD)"
    if name in bf.rules:
        kind, kw = bf.rules[name]
        vis = bf.strings(kw["visibility"]) if "visibility" in kw else bf.strings(bf.default_visibility)
        if pkg != here and not tree.visible(vis, here):
            return f"{label}: {kind} not visible to //{here} (visibility {vis})"
        return None
    if (tree.root / pkg / name).is_file():
        if pkg == here:
            return None
        if name not in bf.exported:
            return f"{label}: file not in exports_files of //{pkg}"
        vis = bf.strings(bf.exported[name]) or ["//visibility:public"]
        if not tree.visible(vis, here):
            return f"{label}: exported file not visible to //{here} (visibility {vis})"
        return None
    return f"{label}: no target or file '{name}' in //{pkg}"


def added_lines(patch_text: str) -> dict[str, list[str]]:
    """{path: lines the patch adds} from a git diff."""
    out: dict[str, list[str]] = {}
    current = None
    for line in patch_text.splitlines():
        m = re.match(r"^diff --git a/(\S+) b/(\S+)", line)
        if m:
            current = m.group(2)
            out[current] = []
        elif current and line.startswith("+") and not line.startswith("+++"):
            out[current].append(line[1:])
    return out


def new_files(patch_text: str) -> list[str]:
    return re.findall(r"^diff --git a/\S+ b/(\S+)\nnew file mode", patch_text, re.M)


def check_build(tree_root: Path, patch_text: str, wheel_include: Path) -> list[Problem]:
    tree = Tree(tree_root)
    problems: list[Problem] = []
    added = added_lines(patch_text)
    for rel in new_files(patch_text):
        if not rel.endswith((".cc", ".h", ".inc")):
            continue
        pkg, name = rel.rsplit("/", 1)
        bf = tree.build(pkg)
        if bf is None:
            problems.append((rel, f"no BUILD in {pkg}"))
            continue
        attrs = ("srcs",) if rel.endswith(".cc") else ("srcs", "hdrs", "textual_hdrs")
        listed = [n for n, (kind, kw) in bf.rules.items()
                  if (kind not in COMPILING_RULES_EXCLUDED or (rel.endswith((".h", ".inc")) and kind == "filegroup"))
                  and any(name in bf.strings(kw.get(a)) for a in attrs)]
        if not listed:
            problems.append((rel, f"not listed in {'srcs of a compiling rule' if rel.endswith('.cc') else 'a rule or filegroup'} of {pkg}/BUILD"))
    for rel, lines in added.items():
        if not rel.endswith("BUILD"):
            continue
        here = rel.rsplit("/", 1)[0]
        for s in re.findall(r'"([^"]+)"', "\n".join(lines)):
            if s.startswith(("//", ":", "@")):
                err = check_label(tree, s, here, wheel_include)
                if err:
                    problems.append((rel, err))
            elif re.fullmatch(r"[\w./-]+\.(cc|h|inc)", s) and not (tree_root / here / s).is_file():
                problems.append((rel, f"lists {s}, which is not in {here}/"))
    return problems


# ---------------------------------------------------------------------------------------------
# API golden files and the pybind names
CONFIG_PY = "tensorflow/python/framework/config.py"
CONTEXT_PY = "tensorflow/python/eager/context.py"
TFE_WRAPPER = "tensorflow/python/tfe_wrapper.cc"
GOLDEN = "tensorflow/tools/api/golden/{v}/tensorflow.config.experimental.pbtxt"
GPU_OPTIONS_GOLDEN = "tensorflow/tools/api/golden/v1/tensorflow.-g-p-u-options.pbtxt"


def exported_functions(config_py: Path, api: str) -> dict[str, list[str]]:
    """{name: argument names} of config.py's functions tf_export'ed as config.experimental.NAME
    in API ``v1`` or ``v2`` (a ``v1=[...]`` list overrides the names for v1)."""
    out: dict[str, list[str]] = {}
    for node in ast.parse(config_py.read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for dec in node.decorator_list:
            if not (isinstance(dec, ast.Call) and ast.unparse(dec.func) == "tf_export"):
                continue
            names = [a.value for a in dec.args if isinstance(a, ast.Constant)]
            v1 = next((k.value for k in dec.keywords if k.arg == "v1"), None)
            if api == "v1" and v1 is not None:
                names = [e.value for e in getattr(v1, "elts", [])]
            for n in names:
                if n.startswith("config.experimental.") and n.count(".") == 2:
                    out[n.split(".")[-1]] = [a.arg for a in node.args.args]
    return out


def golden_methods(path: Path) -> dict[str, list[str]]:
    text = path.read_text()
    out = {}
    for name, argspec in re.findall(r'member_method \{\s*name: "(\w+)"\s*argspec: "(.*?)"\s*\}', text, re.S):
        m = re.match(r"args=\[(.*?)\]", argspec)
        out[name] = re.findall(r"\\'(\w+)\\'", m.group(1)) if m else []
    return out


def proto_fields(config_proto: Path, message: str) -> dict[str, int]:
    """{field: number} of ``message`` nested anywhere in config.proto (first match)."""
    text = config_proto.read_text()
    m = re.search(rf"\bmessage {message} \{{", text)
    if not m:
        return {}
    depth, i = 1, m.end()
    while depth and i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    body = text[m.end():i]
    body = re.sub(r"message \w+ \{.*?\n\s*\}", "", body, flags=re.S)  # nested messages' own fields
    return {n: int(num) for n, num in re.findall(r"^\s*(?:repeated\s+)?[\w.]+ (\w+) = (\d+)", body, re.M)}


def check_golden(tree: Path) -> list[Problem]:
    problems: list[Problem] = []
    for v in ("v1", "v2"):
        rel = GOLDEN.format(v=v)
        want, have = exported_functions(tree / CONFIG_PY, v), golden_methods(tree / rel)
        # config.experimental also has functions exported from other files (not config.py):
        # only the names config.py exports, and the golden names of config.py, must agree.
        for name, args in want.items():
            if name not in have:
                problems.append((rel, f"config.py exports config.experimental.{name} but the golden file lacks it"))
            elif have[name] != args:
                problems.append((rel, f"{name}: golden args {have[name]} != config.py {args}"))
        for name in have:
            if "lms" in name or name == "get_memory_stats":
                if name not in want:
                    problems.append((rel, f"golden lists {name}, which config.py does not export"))
    fields = proto_fields(tree / "tensorflow/core/protobuf/config.proto", "Experimental")
    golden = (tree / GPU_OPTIONS_GOLDEN).read_text()
    for name, number in fields.items():
        if not re.search(rf'name: "{name}"\s*number: {number}\b', golden):
            problems.append((GPU_OPTIONS_GOLDEN, f"GPUOptions.Experimental.{name} = {number} missing"))
    return problems


def pybind_names(tfe_wrapper: Path) -> set[str]:
    text = tfe_wrapper.read_text()
    names = set(re.findall(r'\bm\.def\(\s*"(\w+)"', text))
    names |= set(re.findall(r'py::(?:class_|enum_)<[^;]*?>\(\s*m,\s*"(\w+)"', text, re.S))
    names |= set(re.findall(r'\bm\.attr\(\s*"(\w+)"\)', text))
    for block in re.findall(r'py::enum_<.*?;', text, re.S):    # values exported into the module
        if ".export_values()" in block:
            names |= set(re.findall(r'\.value\(\s*"(\w+)"', block))
    return names


def pywrap_uses(py: Path) -> dict[str, int]:
    """{NAME: first line} for every ``pywrap_tfe.NAME`` (or ``hasattr(pywrap_tfe, "NAME")``)."""
    out: dict[str, int] = {}
    for node in ast.walk(ast.parse(py.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "pywrap_tfe":
            out.setdefault(node.attr, node.lineno)
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "hasattr" and len(node.args) == 2 \
                and ast.unparse(node.args[0]) == "pywrap_tfe" and isinstance(node.args[1], ast.Constant):
            out.setdefault(node.args[1].value, node.lineno)
    return out


# Called by stock TensorFlow 2.14.1's context.py and never defined by its tfe_wrapper.cc: the call
# sits behind `if self._mirroring_policy is not None`, which nothing sets. Not the patch's to fix;
# tests/test_tf_wiring_check.py checks on the stock tree that this list is exactly what it has.
UPSTREAM_UNDEFINED = {"TFE_ContextOptionsSetMirroringPolicy"}


def check_pybind(tree: Path) -> list[Problem]:
    defined = pybind_names(tree / TFE_WRAPPER) | UPSTREAM_UNDEFINED
    problems = []
    for rel in (CONTEXT_PY, CONFIG_PY):
        for name, line in sorted(pywrap_uses(tree / rel).items()):
            if name not in defined:
                problems.append((rel, f"line {line}: pywrap_tfe.{name} is not defined by {TFE_WRAPPER}"))
    return problems
