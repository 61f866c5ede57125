"""Runs `angpt eval` bad-input cases in one fresh interpreter (each case through modeling_angpt.cli.main, as
the console script does), so the test pays the torch/transformers start-up once instead of once per case.
Everything written to file descriptor 2 during a case is that case's stderr; an escaping exception is
printed as the interpreter would (a traceback) with exit status 1.

    python tests/drivers/eval_cli.py CASES_JSON   ->   stdout: {name: {"returncode": int, "stderr": str}}
"""
import json
import os
import sys
import tempfile
import traceback


def run_case(argv):
    with tempfile.TemporaryFile(mode="w+") as capture:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(capture.fileno(), 2)
        try:
            from modeling_angpt import cli

            code = cli.main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        return {"returncode": int(code or 0), "stderr": capture.read()}


if __name__ == "__main__":
    cases = json.loads(sys.argv[1])
    print(json.dumps({name: run_case(argv) for name, argv in cases.items()}))
