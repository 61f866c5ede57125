"""transformers' own common tests (ModelTesterMixin, ConfigTester, GenerationTesterMixin), taken from the source
distribution of the installed transformers version: `pip download` fetches it once into a cache folder, the test
files are extracted there and imported as the package `transformers_sdist_tests`. Nothing of theirs is copied into
this repository.

The sdist ships tests/test_modeling_common.py and tests/test_configuration_common.py but not every module they
import (tests/generation/test_utils.py, tests/exporters/test_export.py, tests/utils/test_configuration_utils.py in
5.25). A missing mixin is replaced by an empty class named `Missing...` and `missing` lists what it would have run,
so the test module reports those checks as skipped with that reason instead of passing them vacuously.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import types
from pathlib import Path

PACKAGE = "transformers_sdist_tests"
WANTED = ("tests/test_modeling_common.py", "tests/test_configuration_common.py", "tests/generation/test_utils.py",
          "tests/exporters/test_export.py", "tests/utils/test_configuration_utils.py")


def cache_dir(version: str) -> Path:
    root = os.environ.get("ANGPT_TRANSFORMERS_TESTS_CACHE") or Path(os.environ.get("XDG_CACHE_HOME")
                                                                     or Path.home() / ".cache") / "angpt"
    return Path(root) / f"transformers-{version}-tests"


def fetch(version: str) -> Path:
    """The folder holding the extracted tests/ of transformers==version (downloaded on first use). RuntimeError with
    one line when the sdist cannot be had (no index reachable). Built in a staging folder and renamed into place,
    so pytest-xdist workers that start together do not see a half-extracted folder."""
    folder = cache_dir(version)
    if (folder / ".extracted").is_file():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", dir=folder.parent))
    try:
        command = [sys.executable, "-m", "pip", "download", f"transformers=={version}", "--no-binary", ":all:",
                   "--no-deps", "-q", "-d", str(staging)]
        result = subprocess.run(command, capture_output=True, text=True)
        archives = sorted(staging.glob(f"transformers-{version}.tar.gz"))
        if not archives:
            lines = result.stderr.strip().splitlines() or ["no output from pip"]
            why = next((line for line in reversed(lines) if line.startswith("ERROR")), lines[-1]).strip()
            raise RuntimeError(f"the source distribution of transformers {version} could not be downloaded: {why}")
        with tarfile.open(archives[0]) as archive:
            prefix = f"transformers-{version}/"
            for member in archive.getmembers():
                name = member.name[len(prefix):]
                if member.isfile() and name in WANTED:
                    target = staging / PACKAGE / name[len("tests/"):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(archive.extractfile(member).read())
        for sub in ("", "generation", "exporters", "utils"):
            (staging / PACKAGE / sub).mkdir(parents=True, exist_ok=True)
            (staging / PACKAGE / sub / "__init__.py").touch()
        archives[0].unlink()
        (staging / ".extracted").touch()
        if folder.exists() and not (folder / ".extracted").is_file():
            shutil.rmtree(folder, ignore_errors=True)  # left half-built by an interrupted run
        try:
            os.rename(staging, folder)
        except OSError:  # another process put it there first
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _placeholder(dotted: str, **names) -> None:
    module = types.ModuleType(dotted)
    module.__dict__.update(names)
    sys.modules[dotted] = module


def load(version: str) -> tuple[types.ModuleType, types.ModuleType, dict[str, str]]:
    """(test_modeling_common, test_configuration_common, missing): `missing` maps each module the sdist lacks to
    what it would have provided."""
    folder = fetch(version)
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    missing = {}
    root = folder / PACKAGE
    if not (root / "generation" / "test_utils.py").is_file():
        missing["generation/test_utils.py"] = "GenerationTesterMixin (transformers' generate tests)"
        _placeholder(f"{PACKAGE}.generation.test_utils",
                     GenerationTesterMixin=type("MissingGenerationTesterMixin", (), {}))
    if not (root / "exporters" / "test_export.py").is_file():
        missing["exporters/test_export.py"] = "ExportTesterMixin (transformers' torch.export tests)"
        _placeholder(f"{PACKAGE}.exporters.test_export", ExportTesterMixin=type("MissingExportTesterMixin", (), {}))
    if not (root / "utils" / "test_configuration_utils.py").is_file():
        missing["utils/test_configuration_utils.py"] = "config_common_kwargs (ConfigTester's arguments check)"
        _placeholder(f"{PACKAGE}.utils.test_configuration_utils", config_common_kwargs=None)
    import importlib

    modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    return modeling, configuration, missing
