"""What a user installs: the source distribution carries every file the build reads, and the
adapters name the framework they miss and how to install it."""
import glob
import os
import shutil
import subprocess
import sys
import tarfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_source_distribution_holds_every_file_the_core_build_reads(tmp_path):
    # From a copy without the egg-info an install leaves: setuptools adds the files that its
    # SOURCES.txt lists to every later sdist, whatever the build declares.
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "*.so",
                                                              "__pycache__", ".pytest_cache", ".hypothesis"))
    subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)], cwd=tree, check=True,
                   capture_output=True, timeout=300)
    (archive,) = tmp_path.glob("horo-*.tar.gz")
    with tarfile.open(archive) as tar:
        # Paths in the archive start with its top directory, horo-<version>/.
        shipped = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    needed = [os.path.relpath(path, ROOT)
              for pattern in ("*.h", "*.cc")
              for path in glob.glob(os.path.join(ROOT, "horo_core", "src", "**", pattern), recursive=True)]
    needed += ["horo_core/horo.map", "horo_core/include/horo/horo.h", "horo_core/_build_ffi.py", "setup.py",
               "pyproject.toml"]
    assert len(needed) > 100
    missing = sorted(set(needed) - shipped)
    assert not missing, f"the sdist lacks {len(missing)} files the build reads: {missing[:10]}"


@pytest.mark.parametrize("adapter, framework, install", [
    ("horo_torch", "torch", "pip install 'torch>=2.3' (or, in a checkout of Horo, pip install -e '.[torch]')"),
    ("horo_tf", "tensorflow", "pip install 'tensorflow>=2.16' 'keras>=3' (or, in a checkout of Horo, "
                              "pip install -e '.[tensorflow]')"),
    ("horo_tf.keras", "tensorflow", "pip install 'tensorflow>=2.16'"),
])
def test_an_adapter_without_its_framework_says_what_to_install(adapter, framework, install):
    # A None entry in sys.modules makes the import fail as a missing module does.
    code = f"import sys; sys.modules[{framework!r}] = None; import {adapter}"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError:"), out.stderr
    # The packages themselves: "horo" on PyPI is another project, so horo[...] would install that.
    assert install in last, out.stderr
