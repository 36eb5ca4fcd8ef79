"""Build backend (PEP 517) of rdzv-etcd: a wheel whose only file is etcd's server, installed as
the `etcd` command of the environment (the wheel's .data/scripts), so that `rdzv run
--rdzv-backend=c10d` finds one after `pip install "rdzv[etcd]"`.

The etcd to pack:
- RDZV_ETCD_BINARY=PATH: that file (scripts/etcd-build.sh's cache), stripped here (`strip`, or
  $STRIP);
- else it is built here from etcd's Go module with the local Go toolchain (GOTOOLCHAIN=local),
  CGO_ENABLED=0 and the linker's stripping (-s -w), for $GOARCH when set (a cross build).
Either way its build information (`go version -m`) must say: etcd's server module at the
version of pyproject.toml, Linux, CGO_ENABLED=0 (a static program, so the wheel's platform tag
promises nothing about libc). The tag follows the binary's GOARCH.

Not setuptools: the wheel carries the licenses of every Go module linked into etcd (and Go's
own), which are known only once the binary exists (its build information lists the modules);
each is read from Go's module cache, `go mod download` fetching what is missing. The license
expression of pyproject.toml is checked against them: a new etcd that links a module under
another license fails the build until the expression says so.

Runs on the Python that builds (3.8 or later; tomllib or tomli reads pyproject.toml).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Iterator, Optional, Sequence

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef,import-not-found,unused-ignore]

HERE = Path(__file__).resolve().parent
SERVER_MODULE = "go.etcd.io/etcd/server/v3"
# GOARCH -> the wheel's architecture. Go's runtime needs Linux 3.2 or later, which
# manylinux2014 (CentOS 7) has, so that is the oldest tag claimed; no libc is used at all, so
# musl systems get the same file.
ARCHES = {"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le", "s390x": "s390x"}
# A fixed time for every member, so that the same binary gives the same wheel.
ZIP_TIME = (1980, 1, 1, 0, 0, 0)
LICENSE_NAME = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE|PATENTS)([.-].*)?$", re.IGNORECASE)


def _project() -> dict:
    with open(HERE / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _etcd_version(project: dict) -> str:
    """v3.7.3 for the distribution 3.7.3 or 3.7.3.postN (a repackaging of the same etcd)."""
    m = re.fullmatch(r"(\d+\.\d+\.\d+)(\.post\d+)?", project["version"])
    if not m:
        raise ValueError(f"version {project['version']!r} is not etcd's version (X.Y.Z[.postN])")
    return "v" + m.group(1)


def _go_env() -> dict:
    """As scripts/etcd-build.sh builds: this Go, no flags or workspace of the caller's, no cgo
    ($GOARCH passes through)."""
    return dict(os.environ, GOTOOLCHAIN="local", GOFLAGS="", GOWORK="off", CGO_ENABLED="0")


def _run(args: list, cwd: Optional[Path] = None, env: Optional[dict] = None) -> str:
    done = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def _obtain(work: Path, version: str) -> Path:
    """The stripped etcd to pack, in work/."""
    binary = work / "etcd"
    given = os.environ.get("RDZV_ETCD_BINARY")
    if given:
        _run([os.environ.get("STRIP", "strip"), "-o", str(binary), given])
        return binary
    build = work / "build"
    build.mkdir()
    env = _go_env()
    _run(["go", "mod", "init", "etcd-build"], cwd=build, env=env)
    _run(["go", "get", f"{SERVER_MODULE}@{version}"], cwd=build, env=env)
    _run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), SERVER_MODULE], cwd=build, env=env)
    return binary


def _build_info(binary: Path) -> tuple:
    """(modules, settings): every module linked in, the main one first, as (path, version),
    and the build settings (CGO_ENABLED, GOOS, GOARCH, ...)."""
    modules: list = []
    settings: dict = {}
    for line in _run(["go", "version", "-m", str(binary)], env=_go_env()).splitlines()[1:]:
        fields = line.strip().split("\t")
        if fields[0] in ("mod", "dep"):
            modules.append((fields[1], fields[2]))
        elif fields[0] == "=>":  # a replacement: its licenses are the ones linked in
            if len(fields) < 3 or not fields[2]:
                raise RuntimeError(f"{modules[-1][0]} is replaced by a local directory: no module to read licenses from")
            modules[-1] = (fields[1], fields[2])
        elif fields[0] == "build":
            key, _, value = fields[1].partition("=")
            settings[key] = value
    return modules, settings


def _check(binary: Path, modules: list, settings: dict, version: str) -> str:
    """The wheel's architecture, once the binary is what the wheel says it is."""
    name = os.environ.get("RDZV_ETCD_BINARY") or "the etcd built"
    want = {"CGO_ENABLED": "0", "GOOS": "linux"}
    if not modules or modules[0] != (SERVER_MODULE, version):
        raise RuntimeError(f"{name} is not {SERVER_MODULE} {version}: its main module is {modules[:1]}")
    for key, value in want.items():
        if settings.get(key) != value:
            raise RuntimeError(f"{name} was built with {key}={settings.get(key)}, not {value}")
    arch = ARCHES.get(settings.get("GOARCH", ""))
    if arch is None:
        raise RuntimeError(f"no wheel tag for GOARCH={settings.get('GOARCH')} (known: {', '.join(ARCHES)})")
    if arch == platform.machine():  # it runs here: the stripped file still works
        out = _run([str(binary), "--version"])
        if f"etcd Version: {version[1:]}" not in out.splitlines():
            raise RuntimeError(f"{name}, stripped, says:\n{out}")
    return arch


def _classify(text: str) -> set:
    """The SPDX identifiers of the licenses a license file states."""
    text = " ".join(text.split())
    found = set()
    if "Apache License" in text and "Version 2.0" in text:
        found.add("Apache-2.0")
    if "Permission is hereby granted, free of charge, to any person obtaining a copy" in text:
        found.add("MIT")
    if "Redistribution and use in source and binary forms" in text:
        found.add("BSD-3-Clause" if "endorse or promote" in text else "BSD-2-Clause")
    if "Permission to use, copy, modify, and/or distribute this software for any purpose" in text:
        found.add("ISC")
    if "Mozilla Public License" in text and "2.0" in text:
        found.add("MPL-2.0")
    return found


def _licenses(modules: list) -> tuple:
    """([(path under .dist-info/licenses/, bytes)], {SPDX id}) for every module linked in and
    for Go's standard library and runtime."""
    work = Path(tempfile.mkdtemp(prefix="rdzv-etcd-licenses-"))  # outside any Go module
    try:
        out = _run(["go", "mod", "download", "-json"] + [f"{p}@{v}" for p, v in modules], cwd=work, env=_go_env())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    dirs = {}
    for doc in _json_stream(out):
        if doc.get("Error"):
            raise RuntimeError(f"go mod download {doc.get('Path')}@{doc.get('Version')}: {doc['Error']}")
        dirs[doc["Path"]] = Path(doc["Dir"])
    goroot = Path(_run(["go", "env", "GOROOT"], env=_go_env()).strip())
    sources = [(path, dirs[path]) for path, _ in modules] + [("go", goroot)]
    files, spdx = [], set()
    for name, root in sources:
        stated = set()
        for f in sorted(root.iterdir()):
            if f.is_file() and LICENSE_NAME.match(f.name):
                text = f.read_bytes()
                files.append((f"{name}/{f.name}", text))
                if not re.match(r"(?i)(NOTICE|PATENTS)", f.name):
                    stated |= _classify(text.decode("utf-8", "replace"))
        if not stated:
            raise RuntimeError(f"{name}: no license file recognised in {root}")
        spdx |= stated
    return files, spdx


def _json_stream(text: str) -> Iterator[dict]:
    """The JSON objects `go mod download -json` prints one after the other."""
    decoder, i = json.JSONDecoder(), 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return
        doc, i = decoder.raw_decode(text, i)
        yield doc


def _metadata(project: dict, license_files: list, dynamic: Sequence[str] = ()) -> bytes:
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {project['name']}",
        f"Version: {project['version']}",
        f"Summary: {project['description']}",
    ]
    if project.get("keywords"):
        lines.append(f"Keywords: {','.join(project['keywords'])}")
    for label, url in project.get("urls", {}).items():
        lines.append(f"Project-URL: {label}, {url}")
    lines.append(f"License-Expression: {project['license']}")
    lines += [f"License-File: {f}" for f in license_files]
    lines += [f"Classifier: {c}" for c in project.get("classifiers", [])]
    if project.get("requires-python"):
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Dynamic: {d}" for d in dynamic]
    readme = project["readme"]
    lines.append("Description-Content-Type: text/markdown")
    return ("\n".join(lines) + "\n\n" + (HERE / readme).read_text(encoding="utf-8")).encode()


def _dist_name(project: dict) -> str:
    return re.sub(r"[-_.]+", "_", project["name"]).lower() + "-" + project["version"]


def build_wheel(wheel_directory: str, config_settings: Optional[dict] = None, metadata_directory: Optional[str] = None) -> str:
    project = _project()
    version = _etcd_version(project)
    work = Path(tempfile.mkdtemp(prefix="rdzv-etcd-wheel-"))
    try:
        binary = _obtain(work, version)
        modules, settings = _build_info(binary)
        arch = _check(binary, modules, settings, version)
        licenses, spdx = _licenses(modules)
        declared = set(project["license"].split(" AND "))
        if spdx != declared:
            raise RuntimeError(
                f"pyproject.toml's license is {project['license']!r}, but the modules linked into etcd "
                f"state {' AND '.join(sorted(spdx))!r}: make the license say that"
            )
        platforms = [f"manylinux_2_17_{arch}", f"manylinux2014_{arch}", f"musllinux_1_1_{arch}"]
        dist = _dist_name(project)
        name = f"{dist}-py3-none-{'.'.join(platforms)}.whl"
        info = f"{dist}.dist-info"
        wheel_meta = "Wheel-Version: 1.0\nGenerator: rdzv_etcd_build\nRoot-Is-Purelib: false\n"
        wheel_meta += "".join(f"Tag: py3-none-{p}\n" for p in platforms)
        members = [(f"{dist}.data/scripts/etcd", binary.read_bytes(), 0o755)]
        members += [(f"{info}/licenses/{path}", text, 0o644) for path, text in licenses]
        members += [
            (f"{info}/METADATA", _metadata(project, [path for path, _ in licenses]), 0o644),
            (f"{info}/WHEEL", wheel_meta.encode(), 0o644),
        ]
        record = io.StringIO()
        # Written beside its name, then renamed: a failed build leaves no wheel behind.
        partial = Path(wheel_directory) / f".{name}.partial"
        try:
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as whl:
                for arcname, data, mode in members:
                    _add(whl, arcname, data, mode)
                    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                    record.write(f"{arcname},sha256={digest},{len(data)}\n")
                record.write(f"{info}/RECORD,,\n")
                _add(whl, f"{info}/RECORD", record.getvalue().encode(), 0o644)
            os.replace(partial, Path(wheel_directory) / name)
        finally:
            partial.unlink(missing_ok=True)
        return name
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _add(whl: zipfile.ZipFile, arcname: str, data: bytes, mode: int) -> None:
    member = zipfile.ZipInfo(arcname, ZIP_TIME)
    member.external_attr = (0o100000 | mode) << 16
    member.compress_type = zipfile.ZIP_DEFLATED
    whl.writestr(member, data)


def build_sdist(sdist_directory: str, config_settings: Optional[dict] = None) -> str:
    """The sources: building the wheel from them needs Go (etcd is built then)."""
    project = _project()
    dist = _dist_name(project)
    name = f"{dist}.tar.gz"
    # The wheel's license files are the Go modules', known once etcd is built.
    pkg_info = _metadata(project, ["LICENSE"], dynamic=["License-File"])
    with tarfile.open(Path(sdist_directory) / name, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for member in ["pyproject.toml", "rdzv_etcd_build.py", "README.md", "LICENSE"]:
            data = (HERE / member).read_bytes()  # LICENSE is a link to the repository's
            _add_tar(tar, f"{dist}/{member}", data)
        _add_tar(tar, f"{dist}/PKG-INFO", pkg_info)
    return name


def _add_tar(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
    member = tarfile.TarInfo(arcname)
    member.size, member.mode, member.mtime = len(data), 0o644, 315532800
    tar.addfile(member, io.BytesIO(data))
