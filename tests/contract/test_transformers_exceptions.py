"""docs/transformers-compat.md lists the transformers common tests that do not apply exactly as
tests/contract/test_transformers_common.py does (that module, run as a script, prints the table; running it does not
download anything)."""
import re
import subprocess
import sys

from cli_helpers import REPO

MODULE = REPO / "tests" / "contract" / "test_transformers_common.py"


def test_docs_table_is_the_modules_list():
    printed = subprocess.run([sys.executable, str(MODULE)], capture_output=True, text=True, check=True).stdout
    page = (REPO / "docs" / "transformers-compat.md").read_text()
    block = re.search(r"<!-- transformers-common exceptions: start -->\n(.*?)<!-- transformers-common exceptions: end -->",
                      page, flags=re.S)
    assert block is not None, "docs/transformers-compat.md lost its generated table's markers"
    assert block.group(1) == printed, ("docs/transformers-compat.md's table differs from the module's list: paste the "
                                       f"output of `.venv/bin/python {MODULE.relative_to(REPO)}`")
    assert printed.count("\n| `test_") >= 3
