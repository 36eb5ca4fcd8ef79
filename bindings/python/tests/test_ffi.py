"""The ctypes declarations against include/rdzv.h: every function declared, with the header's
parameter and return types; status codes and constants identical; library lookup."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys

import pytest

from conftest import PKG_ROOT, REPO_ROOT
from rdzv import _ffi, errors

HEADER = REPO_ROOT / "include" / "rdzv.h"

# Normalised C types (no const, no names, no spaces) -> the ctypes type they must be declared as.
C_TO_CTYPES = {
    "void": None,
    "bool": ctypes.c_bool,
    "rdzv_status_t": ctypes.c_int,
    "char*": ctypes.c_char_p,
    "char**": ctypes.POINTER(ctypes.c_char_p),
    "bool*": ctypes.POINTER(ctypes.c_bool),
    "uint8_t*": _ffi.BytesP,
    "uint8_t**": ctypes.POINTER(_ffi.BytesP),
    "size_t": ctypes.c_size_t,
    "size_t*": ctypes.POINTER(ctypes.c_size_t),
    "int32_t": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32,
    "uint32_t*": ctypes.POINTER(ctypes.c_uint32),
    "int64_t": ctypes.c_int64,
    "int64_t*": ctypes.POINTER(ctypes.c_int64),
    "rdzv_error_t*": _ffi.ErrorP,
    "rdzv_error_t**": _ffi.ErrorPP,
    "rdzv_params_t*": _ffi.ParamsP,
    "rdzv_params_t**": ctypes.POINTER(_ffi.ParamsP),
    "rdzv_t*": _ffi.RdzvP,
    "rdzv_t**": ctypes.POINTER(_ffi.RdzvP),
    "rdzv_store_t*": _ffi.StoreP,
    "rdzv_store_t**": ctypes.POINTER(_ffi.StoreP),
    "rdzv_round_t*": ctypes.POINTER(_ffi.rdzv_round_t),
    "rdzv_inprocess_round_t*": ctypes.POINTER(_ffi.rdzv_inprocess_round_t),
    "rdzv_admin_t*": _ffi.AdminP,
    "rdzv_admin_t**": ctypes.POINTER(_ffi.AdminP),
    "rdzv_cancel_token_t*": _ffi.CancelTokenP,
    "rdzv_cancel_token_t**": ctypes.POINTER(_ffi.CancelTokenP),
    "rdzv_run_status_t*": _ffi.RunStatusP,
    "rdzv_run_status_t**": ctypes.POINTER(_ffi.RunStatusP),
    "rdzv_log_handler_t": _ffi.LogHandler,
    "void*": ctypes.c_void_p,
}


def header_text(keep_defines: bool = False) -> str:
    assert HEADER.is_file(), f"{HEADER} is missing"
    text = HEADER.read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    if keep_defines:
        return text
    return re.sub(r"(?m)^\s*#.*$", "", text)  # preprocessor lines


def header_functions() -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, [parameter types]) for every rdzv_* function in the header."""
    found = {}
    for m in re.finditer(r"([A-Za-z_][\w\s\*]*?)\b(rdzv_\w+)\s*\(([^)]*)\)\s*;", header_text()):
        ret, name, args = m.groups()
        params = [a.strip() for a in args.split(",") if a.strip() and a.strip() != "void"]
        found[name] = (normalise(ret), [normalise(p, named=True) for p in params])
    return found


def normalise(decl: str, named: bool = False) -> str:
    decl = decl.replace("*", " * ")
    tokens = [t for t in decl.split() if t != "const"]
    if named:
        assert tokens and tokens[-1] != "*", f"unnamed parameter {decl!r}"
        tokens = tokens[:-1]
    return tokens[0] + "*" * tokens.count("*") if tokens else ""


def test_header_parses():
    funcs = header_functions()
    # Sanity: the parser sees the API, so an empty set cannot pass the coverage test below.
    assert len(funcs) >= 30
    assert "rdzv_next" in funcs and "rdzv_store_multi_set" in funcs
    assert funcs["rdzv_next"][1] == ["rdzv_t*", "rdzv_round_t*", "rdzv_store_t**", "rdzv_error_t**"]


def test_every_header_function_is_declared():
    missing = sorted(set(header_functions()) - set(_ffi.SIGNATURES))
    assert not missing, f"functions of rdzv.h without ctypes declarations in _ffi.py: {missing}"
    extra = sorted(set(_ffi.SIGNATURES) - set(header_functions()))
    assert not extra, f"declared in _ffi.py but not in rdzv.h: {extra}"


@pytest.mark.parametrize("name", sorted(header_functions()))
def test_declaration_matches_header(name):
    ret, params = header_functions()[name]
    restype, argtypes = _ffi.SIGNATURES[name]
    assert ret in C_TO_CTYPES, f"{name}: no mapping for return type {ret}"
    assert restype is C_TO_CTYPES[ret], f"{name}: restype {restype} for C {ret}"
    assert len(argtypes) == len(params), f"{name}: {len(argtypes)} argtypes, header has {params}"
    for i, (c_type, declared) in enumerate(zip(params, argtypes)):
        assert c_type in C_TO_CTYPES, f"{name}: no mapping for parameter type {c_type}"
        assert declared is C_TO_CTYPES[c_type], f"{name} parameter {i}: {declared} for C {c_type}"


# Normalised C field types -> the ctypes type the Structure must use for them.
C_FIELD_TO_CTYPES = {
    "bool": ctypes.c_bool,
    "uint16_t": ctypes.c_uint16,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "int64_t": ctypes.c_int64,
    "size_t": ctypes.c_size_t,
    "char*": ctypes.c_char_p,
    "rdzv_member_t*": ctypes.POINTER(_ffi.rdzv_member_t),
    "rdzv_joiner_t*": ctypes.POINTER(_ffi.rdzv_joiner_t),
}


def header_structs() -> dict[str, list[tuple[str, str]]]:
    """name -> [(field name, normalised C type)] for every ``typedef struct {...} name;``."""
    found = {}
    for body, name in re.findall(r"typedef struct\s*\{([^}]*)\}\s*(\w+)\s*;", header_text()):
        fields = []
        for decl in body.split(";"):
            if not decl.strip():
                continue
            decl = decl.replace("*", " * ")
            tokens = [t for t in decl.split() if t != "const"]
            fields.append((tokens[-1], tokens[0] + "*" * tokens.count("*")))
        found[name] = fields
    return found


@pytest.mark.parametrize("name", ["rdzv_member_t", "rdzv_joiner_t", "rdzv_run_status_t"])
def test_structure_matches_header(name):
    """Field order and types as in rdzv.h: ctypes lays a Structure out as a C compiler does,
    so equal declarations give equal offsets."""
    fields = header_structs().get(name)
    assert fields, f"{name} not found in rdzv.h"
    declared = getattr(_ffi, name)._fields_
    assert [f for f, _ in declared] == [f for f, _ in fields], name
    for (field, c_type), (_, ctype) in zip(fields, declared):
        assert c_type in C_FIELD_TO_CTYPES, f"{name}.{field}: no mapping for {c_type}"
        assert ctype is C_FIELD_TO_CTYPES[c_type], f"{name}.{field}: {ctype} for C {c_type}"


def test_structure_offsets_match_the_c_compiler(tmp_path):
    """The offset of every field and the size of each struct as the C compiler lays them out
    from rdzv.h (what the library was built against), compared with ctypes'."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler on PATH")
    names = ["rdzv_round_t", "rdzv_inprocess_round_t", "rdzv_member_t", "rdzv_joiner_t",
             "rdzv_run_status_t"]
    structs = header_structs()
    lines = []
    for name in names:
        lines.append(f'printf("{name} size %zu\\n", sizeof({name}));')
        for field, _ in structs[name]:
            field = field.split("[")[0]
            lines.append(f'printf("{name} {field} %zu\\n", offsetof({name}, {field}));')
    source = tmp_path / "layout.c"
    source.write_text(
        "#include <stddef.h>\n#include <stdio.h>\n#include <rdzv.h>\n"
        "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n"
    )
    exe = tmp_path / "layout"
    subprocess.run([cc, "-I", str(HEADER.parent), str(source), "-o", str(exe)], check=True,
                   timeout=120)
    seen = {}
    for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True,
                               timeout=60).stdout.splitlines():
        name, what, value = line.split()
        seen[(name, what)] = int(value)
    for name in names:
        cls = getattr(_ffi, name)
        assert seen[(name, "size")] == ctypes.sizeof(cls), name
        for field, _ in cls._fields_:
            assert seen[(name, field)] == getattr(cls, field).offset, f"{name}.{field}"


def test_library_exports_every_declared_function():
    lib = _ffi.lib()
    for name, (restype, argtypes) in _ffi.SIGNATURES.items():
        fn = getattr(lib, name)
        assert fn.restype is restype and fn.argtypes == argtypes


def test_status_codes_match_header():
    values = {
        name: int(value)
        for name, value in re.findall(r"\b(RDZV_(?:OK|ERR_\w+))\s*=\s*(\d+)", header_text())
    }
    assert values["RDZV_OK"] == 0 and len(values) >= 10
    assert {v: k for k, v in values.items()} == _ffi.STATUS_NAMES
    assert {s.name: int(s) for s in _ffi.Status} == values
    for name, value in values.items():
        assert getattr(_ffi, name) is _ffi.Status(value)
        assert _ffi.lib().rdzv_status_name(value).decode() == name
        if value:
            cls = errors.ERROR_CLASSES[value]
            assert cls.status is _ffi.Status(value) and issubclass(cls, errors.RendezvousError)
            assert cls("m", value).status_name == name
    assert issubclass(errors.ERROR_CLASSES[_ffi.RDZV_ERR_INVALID_ARGUMENT], ValueError)


def test_constants_match_header():
    for name in ("RDZV_MAX_VALUE_BYTES", "RDZV_ADDR_CAPACITY", "RDZV_MAX_KEY_BYTES"):
        m = re.search(rf"#define\s+{name}\s+([^\n]+)", header_text(keep_defines=True))
        assert m, name
        expr = m.group(1).strip()
        assert re.fullmatch(r"[\d\s()+\-*]+", expr), expr
        assert eval(expr) == getattr(_ffi, name), name  # arithmetic on literals only
    assert _ffi.rdzv_round_t.master_addr.size == _ffi.RDZV_ADDR_CAPACITY


def test_error_object_round_trip():
    """An error from the library carries its status and message, and is freed by the wrapper."""
    from rdzv._native import call

    out = _ffi.ParamsP()
    with pytest.raises(errors.RendezvousInvalidArgumentError, match="min_nodes"):
        call(_ffi.lib().rdzv_params_new, b"etcd-v3", b"127.0.0.1:2379", b"r", 0, 1,
             ctypes.byref(out))
    assert not out  # outputs are written only on success


def _python(code: str, env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("RDZV_LIBRARY", None)
    env.update(env_extra)
    env["PYTHONPATH"] = str(PKG_ROOT)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=60)


def test_library_from_env_var():
    real = _ffi.lib()._name
    r = _python("import rdzv._ffi as f; print(f.library_path())", {"RDZV_LIBRARY": real})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == real


def test_bad_env_var_is_an_error_not_a_fallback(tmp_path):
    bogus = tmp_path / "nope" / "librdzv.so"
    r = _python("import rdzv._ffi as f; f.lib()", {"RDZV_LIBRARY": str(bogus)})
    assert r.returncode != 0
    assert "RDZV_LIBRARY" in r.stderr and str(bogus) in r.stderr


def test_import_does_not_load_the_library(tmp_path):
    code = "import rdzv, rdzv.torch_backend, rdzv._ffi as f; assert f._lib is None; print('ok')"
    r = _python(code, {"RDZV_LIBRARY": str(tmp_path / "missing.so")})
    assert r.returncode == 0, r.stderr


def test_lookup_order_without_env_var():
    paths = _ffi.candidate_paths()
    pkg_dir = PKG_ROOT / "rdzv"
    assert paths[0] == pkg_dir / _ffi.LIBRARY_FILE
    assert paths[1:] == [
        REPO_ROOT / "target" / "release" / _ffi.LIBRARY_FILE,
        REPO_ROOT / "target" / "debug" / _ffi.LIBRARY_FILE,
    ]
    if "RDZV_LIBRARY" not in os.environ:
        assert _ffi.find_library() == next(p for p in paths if p.is_file())


def test_library_version_matches_the_package():
    import rdzv

    assert rdzv.version() == rdzv.__version__
